"""Several processes on one PostgreSQL, as deployed: two `fleetllm serve` replicas on two loopback
ports share the fetch log and each serve by commit; two `fleetllm reconcile --once` started together
run exactly one pass between them (the advisory lock)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetllm.adapters.state import open_store
from fleetllm.adapters.state.records import BoxApi
from tests.conftest import ROOT, TEST_LEGACY_KEY, TEST_SALT, git
from tests.server.conftest import ENV, FLEET_KEY, KNOWN_BOX, SECRETS, base_config
from tests.state.postgres import free_port, split_password

PG_PASSWORD_ENV = "T_PG_PASSWORD"


def state_section(pg_url: str) -> tuple[dict[str, Any], dict[str, str]]:
    """The config's state section for `pg_url` (its password as a reference) and the env it needs."""
    url, password = split_password(pg_url)
    section: dict[str, Any] = {"url": url}
    if password is None:
        return section, {}
    section["password"] = f"${{env:{PG_PASSWORD_ENV}}}"
    return section, {PG_PASSWORD_ENV: password}


class Replica:
    def __init__(self, config: Path, env: dict[str, str], log: Path) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = log
        with log.open("w") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "fleetllm", "serve", "--config", str(config), "--listen",
                 f"127.0.0.1:{self.port}"], stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                env={**os.environ, **env}, start_new_session=True)

    def get(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, Any]:
        request = urllib.request.Request(self.base + path, headers=headers or {})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    def wait_ready(self) -> dict[str, Any]:
        deadline = time.monotonic() + 60
        while True:
            try:
                status, body = self.get("/health")
                if status == 200:
                    return dict(body)
            except (urllib.error.URLError, ConnectionError):
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"replica on {self.port} did not start:\n{self.log.read_text()}")
            time.sleep(0.2)

    def config(self, box: str) -> tuple[int, Any]:
        return self.get("/vllm/config", {"Authorization": f"Bearer {FLEET_KEY}", "X-LLMAO-Host": box})

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, sig)
            self.process.wait(timeout=20)


@pytest.fixture
def replicas(tmp_path: Path, fleet_git: Path, pg_url: str) -> Iterator[tuple[Replica, Replica]]:
    document = base_config(fleet_git, tmp_path / "unused.sqlite3")
    document["repo"]["refresh_interval_s"] = 1
    document["state"], pg_env = state_section(pg_url)
    config = tmp_path / "cp.yaml"
    config.write_text(yaml.safe_dump(document))
    env = {**ENV, **pg_env}
    started = [Replica(config, env, tmp_path / f"replica-{i}.log") for i in (1, 2)]
    try:
        yield started[0], started[1]
    finally:
        for replica in started:
            replica.kill(signal.SIGTERM)


def test_two_replicas_share_the_fetch_log_serve_by_commit_and_survive_each_other(
        replicas: tuple[Replica, Replica], fleet_git: Path, pg_url: str) -> None:
    a, b = replicas
    health_a, health_b = a.wait_ready(), b.wait_ready()
    head = git(fleet_git, "rev-parse", "HEAD")
    assert health_a["revision"] == health_b["revision"] == head  # they agree: the same commit
    assert health_a["replica"] != health_b["replica"]
    assert health_a["state"] == {"backend": "postgresql", "fetch_log_error": None}

    answered = [(a, KNOWN_BOX), (b, KNOWN_BOX), (b, "203.0.113.10")]
    for replica, box in answered:
        status, body = replica.config(box)
        assert status == 200
        assert body["host"] == box
        assert body["revision"] == head

    store = open_store(pg_url)  # what any operator (or the reconciler) reads: one shared log
    try:
        deadline = time.monotonic() + 15  # each replica writes its records in batches
        while len(records := store.recent_fetches()) < len(answered) and time.monotonic() < deadline:
            time.sleep(0.2)
        seen = sorted((r.replica, r.box, r.status, r.revision) for r in records)
        expected = sorted((replica_health["replica"], box, 200, head) for (replica, box), replica_health in
                          zip(answered, (health_a, health_b, health_b), strict=True))
        assert seen == expected  # each fetch once, by the replica that answered it
        assert all(r.endpoint is BoxApi.CONFIG for r in records)
        assert set(store.box_facts()) == {KNOWN_BOX, "203.0.113.10"}  # what the reconciler reads from it
    finally:
        store.close()

    # Each tracks the branch on its own, and they meet again on the new commit.
    placement = fleet_git / "placement.yaml"
    placement.write_text(placement.read_text().replace("    - [qwen3-8b, 8002, qwen3-8b-b]\n", ""))
    git(fleet_git, "commit", "-qam", "one server fewer")
    new_head = git(fleet_git, "rev-parse", "HEAD")
    deadline = time.monotonic() + 30
    while {a.get("/health")[1]["revision"], b.get("/health")[1]["revision"]} != {new_head}:
        assert time.monotonic() < deadline, "the replicas did not both move to the new commit"
        time.sleep(0.3)

    a.kill()  # a replica dies: the other goes on serving, and logging
    status, body = b.config(KNOWN_BOX)
    assert status == 200
    assert [s["name"] for s in body["servers"]] == ["qwen3-8b"]
    with pytest.raises(OSError):  # refused (URLError), or reset while the killed worker's socket closes
        a.get("/health")
    b.kill(signal.SIGTERM)  # a graceful stop writes out what is buffered
    store = open_store(pg_url)
    try:
        last = store.recent_fetches(limit=1)[0]
        assert (last.replica, last.revision) == (health_b["replica"], new_head)
        text = a.log.read_text() + b.log.read_text()
        for secret in (*SECRETS, split_password(pg_url)[1] or "no-password"):
            assert secret not in text
    finally:
        store.close()


class SlowLitellm:
    """LiteLLM's listing that answers (an empty list) only once released, so a pass lasts as long as
    the test needs."""

    def __init__(self) -> None:
        self.release = threading.Event()
        release = self.release

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                release.wait(timeout=90)
                body = b'{"data": [], "total_pages": 1}'
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def test_two_reconcilers_started_together_run_one_pass(tmp_path: Path, fleet_dir: Path, pg_url: str) -> None:
    # No static boxes (nothing is probed) and no provider access: the pass observes LiteLLM only.
    placement = fleet_dir / "placement.yaml"
    placement.write_text(placement.read_text().split("  # Legacy pair")[0])
    (fleet_dir / "fleet.yaml").write_text((fleet_dir / "fleet.yaml").read_text().split("legacy_servers:")[0]
                                         + "fleet_id: example\n")  # what the cut-off tail said
    litellm = SlowLitellm()
    state, pg_env = state_section(pg_url)
    config = tmp_path / "cp.yaml"
    config.write_text(yaml.safe_dump({
        "repo": {"path": str(fleet_dir)}, "state": state,
        "secrets": {"vllm_api_salt": "${env:SALT}", "legacy_api_key": "${env:LEGACY}"},
        "litellm": {"url": litellm.url, "master_key": "${env:MK}", "timeout_s": 120}}))
    env = {**os.environ, **pg_env, "SALT": TEST_SALT, "LEGACY": TEST_LEGACY_KEY, "MK": "sk-master-replica-test"}
    command = [sys.executable, "-m", "fleetllm", "reconcile", "--once", "--config", str(config), "--repo",
               str(fleet_dir)]
    jobs = [subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)]
    try:
        deadline = time.monotonic() + 90
        while all(job.poll() is None for job in jobs) and time.monotonic() < deadline:
            time.sleep(0.1)  # the pass holding the lock waits on LiteLLM; the other one finishes
        litellm.release.set()
        outputs = [job.communicate(timeout=120) for job in jobs]
    finally:
        for job in jobs:
            if job.poll() is None:
                job.kill()
                job.wait()
        litellm.close()
    events = [[json.loads(line)["event"] for line in err.splitlines() if line.startswith("{")] for _, err in outputs]
    ran = [e for e in events if "reconcile_pass" in e]
    skipped = [i for i, e in enumerate(events) if "reconcile_pass_skipped" in e]
    assert len(ran) == 1, outputs
    assert len(skipped) == 1, outputs
    skip_line = next(json.loads(line) for line in outputs[skipped[0]][1].splitlines()
                     if '"reconcile_pass_skipped"' in line)
    assert "another reconcile pass holds the PostgreSQL advisory lock" in skip_line["reason"]
    assert "fleetllm-reconcile" in skip_line["reason"]  # who holds it
    assert jobs[skipped[0]].returncode == 0
    store = open_store(pg_url)
    try:
        assert len(store.recent_passes()) == 1
    finally:
        store.close()
    for out, err in outputs:
        assert "sk-master-replica-test" not in out + err
