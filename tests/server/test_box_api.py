"""GET /vllm/config, POST /vllm/report, GET /vllm/installer through the real Flask app."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable
from typing import Any

import pytest
from flask.testing import FlaskClient

from fleetllm.adapters.state.records import BoxApi
from fleetllm.core.fleet.bearer import Salt
from fleetllm.server.app import create_app
from fleetllm.server.runtime import Runtime
from tests.conftest import TEST_LEGACY_KEY, TEST_SALT
from tests.server.conftest import FLEET_KEY, KNOWN_BOX, SECRETS, LogCapture, box_headers

PEER = {"REMOTE_ADDR": "192.0.2.50"}


def get_config(client: FlaskClient, headers: dict[str, str], peer: str = "192.0.2.50") -> Any:
    return client.get("/vllm/config", headers=headers, environ_base={"REMOTE_ADDR": peer})


def test_known_box_gets_its_json_with_headers(client: FlaskClient, runtime: Runtime) -> None:
    response = get_config(client, box_headers())
    assert response.status_code == 200
    body = response.get_json()
    served = runtime.tracker.served
    assert served is not None
    assert body["host"] == KNOWN_BOX
    assert body["revision"] == served.revision
    assert [s["name"] for s in body["servers"]] == ["qwen3-8b", "qwen3-8b-b"]
    assert body["servers"][0]["api_key"] == Salt(TEST_SALT).derive(KNOWN_BOX, 8001)
    assert response.headers["Cache-Control"] == "no-store"
    assert response.headers["X-Fleet-Revision"] == served.revision
    assert response.headers["ETag"].startswith('"')
    assert len(response.headers["ETag"]) > 10
    assert response.mimetype == "application/json"
    assert TEST_SALT not in response.get_data(as_text=True)


def test_legacy_pair_gets_the_shared_key(client: FlaskClient) -> None:
    body = get_config(client, box_headers("198.51.100.23")).get_json()
    assert body["servers"][0]["api_key"] == TEST_LEGACY_KEY


def test_if_none_match_gives_304(client: FlaskClient) -> None:
    first = get_config(client, box_headers())
    etag = first.headers["ETag"]
    again = get_config(client, box_headers(**{"If-None-Match": etag}))
    assert again.status_code == 304
    assert again.data == b""
    assert again.headers["ETag"] == etag
    assert again.headers["X-Fleet-Revision"] == first.headers["X-Fleet-Revision"]
    assert again.headers["Cache-Control"] == "no-store"
    other = get_config(client, box_headers(**{"If-None-Match": '"something-else"'}))
    assert other.status_code == 200


def test_missing_key_403(client: FlaskClient) -> None:
    response = get_config(client, box_headers(key=None))
    assert response.status_code == 403
    assert "missing fleet key" in response.get_json()["error"]
    assert "X-Fleet-Revision" not in response.headers


def test_wrong_key_403(client: FlaskClient) -> None:
    for header in (f"Bearer {FLEET_KEY}x", f"Bearer {FLEET_KEY[:-1]}", "Bearer ", f"Basic {FLEET_KEY}", FLEET_KEY):
        response = get_config(client, {"Authorization": header, "X-LLMAO-Host": KNOWN_BOX})
        assert response.status_code == 403, header


def test_scheme_is_case_insensitive(client: FlaskClient) -> None:
    assert get_config(client, {"Authorization": f"bearer {FLEET_KEY}", "X-LLMAO-Host": KNOWN_BOX}).status_code == 200


def test_no_fleet_key_configured_503(make_runtime: Callable[..., Runtime]) -> None:
    runtime = make_runtime(secrets={"fleet_key": None, "vllm_api_salt": "${env:SALT}"})
    client = create_app(runtime).test_client()
    for headers in (box_headers(), box_headers(key=None)):
        for path in ("/vllm/config", "/vllm/installer"):
            assert client.get(path, headers=headers).status_code == 503
        assert client.post("/vllm/report", headers=headers, json={}).status_code == 503


def test_claimed_host_is_exclusive(client: FlaskClient) -> None:
    # The peer and X-Forwarded-For are known boxes, but the claim wins and is unknown: 404, no fallback.
    response = get_config(client, box_headers("198.51.100.99", **{"X-Forwarded-For": KNOWN_BOX}), peer=KNOWN_BOX)
    assert response.status_code == 404
    assert "198.51.100.99" in response.get_json()["error"]


def test_empty_claim_is_a_claim(client: FlaskClient) -> None:
    assert get_config(client, box_headers(""), peer=KNOWN_BOX).status_code == 404


def test_leftmost_forwarded_for(client: FlaskClient) -> None:
    response = get_config(client, box_headers(None, **{"X-Forwarded-For": f"{KNOWN_BOX}, 10.0.0.1"}))
    assert response.status_code == 200
    assert response.get_json()["host"] == KNOWN_BOX
    response = get_config(client, box_headers(None, **{"X-Forwarded-For": f"10.0.0.1, {KNOWN_BOX}"}), peer=KNOWN_BOX)
    assert response.status_code == 404


def test_peer_when_no_headers(client: FlaskClient) -> None:
    assert get_config(client, box_headers(None), peer=KNOWN_BOX).get_json()["host"] == KNOWN_BOX


def test_ipv4_mapped_peer_is_normalised(client: FlaskClient) -> None:
    response = get_config(client, box_headers(None), peer=f"::ffff:{KNOWN_BOX}")
    assert response.status_code == 200
    assert response.get_json()["host"] == KNOWN_BOX
    forwarded = get_config(client, box_headers(None, **{"X-Forwarded-For": f"::ffff:{KNOWN_BOX}"}))
    assert forwarded.get_json()["host"] == KNOWN_BOX


def test_trusted_proxies_gate_forwarded_for(make_runtime: Callable[..., Runtime]) -> None:
    client = create_app(make_runtime(trusted_proxies=["10.0.0.0/8"])).test_client()
    spoofed = box_headers(None, **{"X-Forwarded-For": KNOWN_BOX})
    # From an untrusted peer X-Forwarded-For is ignored: the peer itself is the box.
    assert get_config(client, spoofed, peer="192.0.2.77").status_code == 404
    # From a trusted proxy, the rightmost untrusted address counts (not what the client prepended).
    chain = box_headers(None, **{"X-Forwarded-For": f"198.51.100.1, {KNOWN_BOX}, 10.1.1.1"})
    response = get_config(client, chain, peer="10.2.2.2")
    assert response.status_code == 200
    assert response.get_json()["host"] == KNOWN_BOX


def test_every_fetch_recorded_and_logged_without_secrets(client: FlaskClient, runtime: Runtime,
                                                         logs: LogCapture) -> None:
    get_config(client, box_headers())
    get_config(client, box_headers(key="wrong-key-wrong-key"))
    get_config(client, box_headers("unknown.example", **{"X-Forwarded-For": "198.51.100.7"}))
    records = runtime.store.recent_fetches()
    assert [(r.status, r.box) for r in records] == [(404, "unknown.example"), (403, None), (200, KNOWN_BOX)]
    assert records[0].forwarded_for == "198.51.100.7"
    assert records[0].claimed_host == "unknown.example"
    assert records[0].peer == "192.0.2.50"
    assert records[2].revision == runtime.tracker.served.revision  # type: ignore[union-attr]
    lines = logs.events("box request")
    assert [line["status"] for line in lines] == [200, 403, 404]
    assert lines[2]["forwarded_for"] == "198.51.100.7"
    assert lines[2]["claimed_host"] == "unknown.example"
    assert lines[0]["revision"] == records[2].revision
    bearer = Salt(TEST_SALT).derive(KNOWN_BOX, 8001)
    for secret in (*SECRETS, bearer, "wrong-key-wrong-key"):
        assert secret not in logs.text


def test_unknown_box_enters_attention_list_capped(client: FlaskClient, runtime: Runtime) -> None:
    for _ in range(3):
        get_config(client, box_headers("new-box.example"), peer="198.51.100.8")
    entry = runtime.store.attention()[0]
    assert (entry.box, entry.count, entry.peer, entry.claimed_host) == ("new-box.example", 3, "198.51.100.8",
                                                                        "new-box.example")
    assert entry.first_seen <= entry.last_seen
    for i in range(50):  # a flood of made-up names
        runtime.clock.now += 1  # type: ignore[attr-defined]
        get_config(client, box_headers(f"made-up-{i}.example"))
    assert runtime.store.attention_size() == 5  # attention.max_entries in the test config
    assert {e.box for e in runtime.store.attention()} == {f"made-up-{i}.example" for i in range(45, 50)}
    assert b"fleetllm_attention_entries 5.0" in client.get("/metrics").data
    assert b"fleetllm_attention_evicted_total 46.0" in client.get("/metrics").data


def test_wrong_key_never_enters_attention(client: FlaskClient, runtime: Runtime) -> None:
    get_config(client, box_headers("new-box.example", key="not-the-fleet-key"))
    assert runtime.store.attention() == []


REPORT: dict[str, Any] = {
    "revision": "abc123", "installer_version": "0.1.0", "outcome": "installed", "message": "2 servers started",
    "fit": {"ok": True, "gpus": [{"index": 0, "name": "RTX A6000", "memory_total_mib": 49140,
                                  "memory_free_mib": 48000}],
            "vram_needed_gb": 18, "vram_total_gb": 48, "disk_needed_gb": 24, "disk_free_gb": 100, "problems": []},
    "servers": [{"name": "qwen3-8b", "port": 8001, "digest": "sha256:x", "unit": "vllm-qwen3-8b",
                 "state": "started"}],
    "units_removed": ["vllm-old"],
}


def post_report(client: FlaskClient, body: Any, headers: dict[str, str] | None = None, **kwargs: Any) -> Any:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return client.post("/vllm/report", data=data, headers=headers or box_headers(), environ_base=PEER,
                       content_type="application/json", **kwargs)


def test_report_recorded(client: FlaskClient, runtime: Runtime) -> None:
    response = post_report(client, REPORT)
    assert response.status_code == 200
    assert response.get_json() == {"status": "recorded"}
    latest = runtime.store.latest_reports()[KNOWN_BOX]
    assert latest.revision == "abc123"
    assert latest.server_digests() == {"qwen3-8b": "sha256:x"}
    assert latest.peer == "192.0.2.50"
    assert runtime.store.recent_fetches()[0].endpoint is BoxApi.REPORT
    minimal = {"revision": "r2", "installer_version": "0.1.0", "outcome": "fit_failed"}
    assert post_report(client, minimal).status_code == 200
    assert [r.revision for r in runtime.store.report_history(KNOWN_BOX)] == ["r2", "abc123"]


def test_report_bad_input_400_with_clear_message(client: FlaskClient) -> None:
    cases = {
        b"not json": "not JSON",
        b"\xff\xfe": "not UTF-8",
        json.dumps({**REPORT, "outcome": "exploded"}).encode(): "/outcome",
        json.dumps({**REPORT, "servers": [{**REPORT["servers"][0], "port": "8001"}]}).encode(): "/servers/0/port",
        json.dumps({k: v for k, v in REPORT.items() if k != "revision"}).encode(): "'revision' is a required",
        json.dumps({**REPORT, "extra": 1}).encode(): "'extra' was unexpected",
        b'{"revision": "a", "installer_version": "1", "outcome": "installed", "fit": {"ok": true, '
        b'"vram_needed_gb": NaN}}': "NaN",
        b"[]": "not of type 'object'",
    }
    for body, expected in cases.items():
        response = post_report(client, body)
        assert response.status_code == 400, body
        assert expected in response.get_json()["error"], (body, response.get_json())


def test_report_too_large_413(client: FlaskClient) -> None:
    body = json.dumps({**REPORT, "message": "x" * (64 * 1024)}).encode()
    assert post_report(client, body).status_code == 413


def test_report_auth_and_host_rules(client: FlaskClient, runtime: Runtime) -> None:
    assert post_report(client, REPORT, box_headers(key=None)).status_code == 403
    assert post_report(client, REPORT, box_headers(key="nope")).status_code == 403
    assert post_report(client, REPORT, box_headers("198.51.100.99")).status_code == 404
    assert runtime.store.latest_reports() == {}
    assert runtime.store.attention()[0].box == "198.51.100.99"


def test_installer_served_with_sha256(client: FlaskClient, runtime: Runtime) -> None:
    response = client.get("/vllm/installer", headers=box_headers(None), environ_base=PEER)
    assert response.status_code == 200
    digest = hashlib.sha256(response.data).hexdigest()
    assert response.headers["X-Installer-Sha256"] == digest == runtime.installer.sha256
    assert response.headers["ETag"] == f'"{digest}"'
    assert response.data.startswith(b"#!/usr/bin/env python3\n")
    cached = client.get("/vllm/installer", headers=box_headers(None, **{"If-None-Match": f'"{digest}"'}))
    assert cached.status_code == 304
    assert client.get("/vllm/installer", headers=box_headers(key=None)).status_code == 403
    assert client.get("/vllm/installer", headers=box_headers(key="bad")).status_code == 403


def test_unknown_route_and_method_are_json(client: FlaskClient) -> None:
    assert client.get("/nope").status_code == 404
    assert client.get("/nope").get_json()["error"]
    assert client.post("/vllm/config").status_code == 405


def test_metrics_count_requests_by_status(client: FlaskClient, runtime: Runtime) -> None:
    get_config(client, box_headers())
    get_config(client, box_headers(key=None))
    get_config(client, box_headers(key=None))
    metrics = client.get("/metrics")
    assert metrics.content_type.startswith("text/plain")
    text = metrics.get_data(as_text=True)
    assert 'fleetllm_box_requests_total{endpoint="config",status="200"} 1.0' in text
    assert 'fleetllm_box_requests_total{endpoint="config",status="403"} 2.0' in text
    assert "fleetllm_served_boxes 4.0" in text
    assert "fleetllm_served_servers 7.0" in text
    assert "fleetllm_git_last_successful_refresh_timestamp_seconds 1.8e+09" in text


def test_box_that_cannot_render_gets_503_others_served(make_runtime: Callable[..., Runtime],
                                                      logs: LogCapture) -> None:
    # No legacy key configured: the legacy pair cannot get its bearer; every other box is unaffected.
    runtime = make_runtime(secrets={"legacy_api_key": None})
    client = create_app(runtime).test_client()
    response = get_config(client, box_headers("198.51.100.23"))
    assert response.status_code == 503
    assert "cannot render box" in response.get_json()["error"]
    assert get_config(client, box_headers()).status_code == 200
    health = client.get("/health").get_json()
    assert "198.51.100.23" in health["render_errors"]
    assert len(logs.events("box cannot be rendered")) == 1


def test_the_installers_reports_are_accepted(client: FlaskClient, runtime: Runtime) -> None:
    """The box side (fleetllm_installer.report) and this server agree on the report's shape."""
    from fleetllm_contract.report import ReportOutcome as BoxOutcome
    from fleetllm_installer.boxjson import parse_text
    from fleetllm_installer.fit import FitResult
    from fleetllm_installer.hardware import Gpu
    from fleetllm_installer.report import ServerState, build_report

    served = get_config(client, box_headers())
    box = parse_text(served.get_data(as_text=True), KNOWN_BOX)
    gpu = Gpu(index=0, uuid="GPU-0", name="NVIDIA RTX A6000", memory_total_mib=49140, memory_free_mib=48900)
    fit = FitResult(ok=True, gpus=(gpu,), vram_needed_gb=18.0, vram_total_gb=48.0, disk_needed_gb=24.0,
                    disk_free_gb=None, problems=())
    installed = build_report(revision=box.revision, installer_version="0.1.0", outcome=BoxOutcome.INSTALLED,
                             message="ok", fit=fit, servers=box.servers,
                             states={s.name: ServerState.STARTED for s in box.servers}, units_removed=["vllm-old"])
    failed = build_report(revision="unknown", installer_version="0.1.0", outcome=BoxOutcome.FAILED,
                          message="x" * 10_000, fit=None, servers=(), states={}, units_removed=[])
    for report in (installed, failed):
        assert post_report(client, report).status_code == 200, post_report(client, report).get_json()
    history = runtime.store.report_history(KNOWN_BOX)
    assert history[1].server_digests() == {s["name"]: s["digest"] for s in served.get_json()["servers"]}


def test_a_gateway_boxs_report_is_accepted(client: FlaskClient, runtime: Runtime) -> None:
    """Reports from a box running the gateway carry its unit; the schema takes it."""
    from fleetllm_contract.report import ReportOutcome as BoxOutcome
    from fleetllm_installer.boxjson import GATEWAY_PROGRAM, GatewaySpec
    from fleetllm_installer.report import ServerState, build_report

    gateway = GatewaySpec(port=8003, api_key="sk-vllm-x", config={}, digest="sha256:" + "0" * 64)
    report = build_report(revision="abc", installer_version="0.1.0", outcome=BoxOutcome.INSTALLED, message="ok",
                          fit=None, servers=(), states={GATEWAY_PROGRAM: ServerState.STARTED}, units_removed=[],
                          gateway=gateway)
    assert report["gateway"]["state"] == "started"
    response = post_report(client, report)
    assert response.status_code == 200, response.get_json()
    bad = {**report, "gateway": {**report["gateway"], "state": "exploded"}}
    assert post_report(client, bad).status_code == 400


OTHER_BOX = "203.0.113.10"  # another box of the example fleet


def test_a_box_reports_only_for_itself(client: FlaskClient, runtime: Runtime) -> None:
    """The fleet key alone does not report: a forged `failed` for another box (its key missing, or this
    box's key) is refused and not recorded, so it cannot halt that box's rollout."""
    failed = {**REPORT, "outcome": "failed", "message": "forged"}
    no_key = box_headers(OTHER_BOX)
    del no_key["X-Fleetllm-Report-Key"]
    refused = post_report(client, failed, no_key)
    assert refused.status_code == 403 and "X-Fleetllm-Report-Key" in refused.get_json()["error"]
    assert "server.report_key_required" in refused.get_json()["error"]
    borrowed = {**box_headers(OTHER_BOX), "X-Fleetllm-Report-Key": box_headers(KNOWN_BOX)["X-Fleetllm-Report-Key"]}
    assert post_report(client, failed, borrowed).status_code == 403
    assert OTHER_BOX not in runtime.store.latest_reports()
    assert post_report(client, failed, box_headers(OTHER_BOX)).status_code == 200
    assert runtime.store.latest_reports()[OTHER_BOX].body["message"] == "forged"


def test_old_boxes_report_without_a_key_only_when_the_operator_says_so(client: FlaskClient, runtime: Runtime,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime, "config", dataclasses.replace(runtime.config, report_key_required=False))
    no_key = box_headers(OTHER_BOX)
    del no_key["X-Fleetllm-Report-Key"]
    assert post_report(client, REPORT, no_key).status_code == 200
    wrong = {**no_key, "X-Fleetllm-Report-Key": "rk-wrong"}
    assert post_report(client, REPORT, wrong).status_code == 403  # a wrong key is refused either way
