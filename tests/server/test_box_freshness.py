"""/metrics: per box of the served revision, when it last got its config and last reported (the
BoxStale alert of deploy/prometheus reads these), straight from the state store at each scrape."""

from __future__ import annotations

from typing import Any

import pytest
from flask.testing import FlaskClient
from prometheus_client.parser import text_string_to_metric_families

from fleetllm.server.runtime import Runtime
from tests.server.conftest import KNOWN_BOX, LogCapture, box_headers
from tests.server.test_box_api import REPORT, get_config, post_report

CONFIG = "fleetllm_box_last_config_timestamp_seconds"
REPORTED = "fleetllm_box_last_report_timestamp_seconds"


@pytest.fixture(autouse=True)
def no_reuse(runtime: Runtime) -> None:
    runtime.metrics.box_freshness.max_age_s = 0  # each scrape reads the store (30 s apart in service)


def series(client: FlaskClient, name: str) -> dict[str, float]:
    text = client.get("/metrics").get_data(as_text=True)
    return {s.labels["box"]: s.value for family in text_string_to_metric_families(text) for s in family.samples
            if s.name == name}


def test_each_served_box_has_its_last_config_and_report_time(client: FlaskClient, runtime: Runtime) -> None:
    served = runtime.tracker.served
    assert served is not None
    before = series(client, CONFIG)
    assert set(before) == set(served.fleet.boxes)  # every box of the revision, none fetched yet: 0
    assert set(before.values()) == {0.0}
    clock: Any = runtime.clock
    assert get_config(client, box_headers()).status_code == 200
    clock.now += 60
    assert post_report(client, REPORT).status_code == 200
    clock.now += 60
    assert get_config(client, box_headers(key=None)).status_code == 403  # refused: not a fetch of its config
    config, reported = series(client, CONFIG), series(client, REPORTED)
    assert config[KNOWN_BOX] == 1_800_000_000.0
    assert reported[KNOWN_BOX] == 1_800_000_060.0
    etag = get_config(client, box_headers()).headers["ETag"]
    clock.now += 60
    assert get_config(client, box_headers(**{"If-None-Match": etag})).status_code == 304  # an agent's poll
    assert series(client, CONFIG)[KNOWN_BOX] == 1_800_000_180.0
    assert all(config[box] == 0.0 for box in served.fleet.boxes if box != KNOWN_BOX)


def value(client: FlaskClient, name: str) -> float:
    text = client.get("/metrics").get_data(as_text=True)
    return next(s.value for family in text_string_to_metric_families(text) for s in family.samples if s.name == name)


def test_unknown_boxes_are_counted_with_their_last_sighting_never_labelled(client: FlaskClient,
                                                                          runtime: Runtime) -> None:
    assert value(client, "fleetllm_unknown_boxes") == 0.0
    assert value(client, "fleetllm_unknown_box_last_seen_timestamp_seconds") == 0.0
    clock: Any = runtime.clock
    for name in ("198.51.100.99", "attacker-chosen-label"):
        clock.now += 10
        assert get_config(client, box_headers(name)).status_code == 404
    assert value(client, "fleetllm_unknown_boxes") == 2.0
    assert value(client, "fleetllm_unknown_box_last_seen_timestamp_seconds") == 1_800_000_020.0
    assert "attacker-chosen-label" not in client.get("/metrics").get_data(as_text=True)
    assert "198.51.100.99" not in series(client, CONFIG)


def test_a_store_failure_leaves_the_rest_of_the_scrape(client: FlaskClient, runtime: Runtime, logs: LogCapture,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> Any:
        raise OSError("password=not-in-the-log")

    monkeypatch.setattr(runtime.store, "last_config_answered", broken)
    response = client.get("/metrics")
    assert response.status_code == 200
    text = response.get_data(as_text=True)
    assert "fleetllm_served_boxes 4.0" in text
    assert f"# TYPE {CONFIG} gauge" in text
    assert series(client, CONFIG) == {}
    assert logs.events("box freshness unavailable")[0]["error"] == "OSError"
    assert "not-in-the-log" not in logs.text


def test_scrapes_within_max_age_reuse_one_read(client: FlaskClient, runtime: Runtime,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    reads = []
    real = runtime.store.last_config_answered

    def counted() -> dict[str, float]:
        reads.append(1)
        return real()

    monkeypatch.setattr(runtime.store, "last_config_answered", counted)
    runtime.metrics.box_freshness.max_age_s = 3600
    for _ in range(3):
        assert client.get("/metrics").status_code == 200
    assert len(reads) == 1
    runtime.metrics.box_freshness.max_age_s = 0
    client.get("/metrics")
    assert len(reads) == 2
