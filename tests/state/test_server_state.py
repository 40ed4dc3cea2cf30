"""The control plane on either state store: /health names the backend and the replica, each fetch
record names the replica that answered, and a database that refuses a write is a 503, never a 500."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from flask.testing import FlaskClient

from fleetllm.server.app import create_app
from fleetllm.server.runtime import Runtime, start_up
from fleetllm.settings import load_config
from tests.server.conftest import ENV, KNOWN_BOX, base_config, box_headers
from tests.state.postgres import split_password


@pytest.fixture
def runtime(tmp_path: Path, fleet_git: Path, store_url: str) -> Iterator[Runtime]:
    document = base_config(fleet_git, tmp_path / "unused.sqlite3")
    url, password = split_password(store_url)
    document["state"] = {"url": url, **({"password": "${env:PG_PASSWORD}"} if password else {})}
    path = tmp_path / "cp.yaml"
    path.write_text(yaml.safe_dump(document))
    started = start_up(load_config(path, {**ENV, "PG_PASSWORD": password or ""}), replica="cp-test-1")
    yield started
    started.stop()


@pytest.fixture
def client(runtime: Runtime) -> FlaskClient:
    return create_app(runtime).test_client()


def test_health_names_the_backend_and_the_replica(client: FlaskClient, runtime: Runtime, store_url: str) -> None:
    health = client.get("/health").get_json()
    assert health["replica"] == "cp-test-1"
    assert health["state"] == {"backend": store_url.split(":")[0], "fetch_log_error": None}
    assert health["branch"] == "main"
    served = runtime.tracker.served
    assert served is not None
    assert health["revision"] == served.revision


def test_fetch_records_name_the_replica(client: FlaskClient, runtime: Runtime) -> None:
    assert client.get("/vllm/config", headers=box_headers()).status_code == 200
    record = runtime.store.recent_fetches(limit=1)[0]
    assert (record.box, record.status, record.replica) == (KNOWN_BOX, 200, "cp-test-1")


def test_a_refused_write_is_a_503(client: FlaskClient, runtime: Runtime) -> None:
    with runtime.store.db.transaction() as tx:
        tx.execute("ALTER TABLE attention RENAME TO attention_away")
    response = client.get("/vllm/config", headers=box_headers(host="203.0.113.99"))  # unknown: noted
    assert response.status_code == 503
    assert "state store is unavailable" in response.get_json()["error"]
    assert client.get("/vllm/config", headers=box_headers()).status_code == 200  # configs are still served
    with runtime.store.db.transaction() as tx:
        tx.execute("ALTER TABLE attention_away RENAME TO attention")


def test_configs_are_served_while_postgres_is_down_and_the_log_catches_up(tmp_path: Path, fleet_git: Path) -> None:
    """A cluster of this test's own, stopped and started again under a running control plane."""
    from tests.state.postgres import Cluster, find_bindir
    from tests.support.integration import missing

    bindir = find_bindir()
    if bindir is None:
        missing("PostgreSQL is not installed (no initdb/pg_ctl): apt-get install postgresql")
    cluster = Cluster(bindir)
    try:
        document = base_config(fleet_git, tmp_path / "unused.sqlite3")
        url, _ = split_password(cluster.url)
        document["state"] = {"url": url, "password": "${env:PG_PASSWORD}"}
        path = tmp_path / "cp.yaml"
        path.write_text(yaml.safe_dump(document))
        runtime = start_up(load_config(path, {**ENV, "PG_PASSWORD": cluster.password}), replica="cp-outage")
        try:
            client = create_app(runtime).test_client()
            assert client.get("/vllm/config", headers=box_headers()).status_code == 200
            runtime.store.flush()
            cluster.halt()
            served = [client.get("/vllm/config", headers=box_headers()).status_code for _ in range(600)]
            assert served == [200] * 600  # past the 512 that trigger a write: still answered
            deadline = time.monotonic() + 30
            while runtime.store.flush_error is None and time.monotonic() < deadline:
                time.sleep(0.2)
            error = client.get("/health").get_json()["state"]["fetch_log_error"]
            assert error is not None
            assert cluster.password not in error
            assert client.get("/admin/fetches", headers={"Authorization": "Bearer " + ENV["VIEWER"]}).status_code == 503
            cluster.start()
            deadline = time.monotonic() + 60
            while runtime.store.flush_error is not None and time.monotonic() < deadline:
                time.sleep(0.2)  # the background writer retries on its own
            assert client.get("/health").get_json()["state"]["fetch_log_error"] is None
            assert len(runtime.store.recent_fetches(limit=1000)) == 601  # none lost
        finally:
            runtime.stop()
    finally:
        cluster.stop()
