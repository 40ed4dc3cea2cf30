"""Staged rollouts against a real `fleetllm serve` process (plain HTTP on loopback) over a real git
repository and its SQLite state store: `fleetllm rollout` through the admin API, and GET /vllm/config
serving an agent box its released revision."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetllm.adapters.state import open_store
from fleetllm.core.boxreport import BoxReport
from fleetllm.core.fleet.jsonvalue import freeze_mapping
from fleetllm.core.rollout.model import BoxRelease, BoxState, Rollout, RolloutState
from fleetllm.demo.procs import free_port, stop
from fleetllm_contract.report import ReportOutcome
from tests.conftest import ROOT, git
from tests.server.conftest import ADMIN_TOKEN, ENV, FLEET_KEY, KNOWN_BOX, VIEWER_TOKEN, base_config, write_config


@pytest.fixture
def server(tmp_path: Path, fleet_git: Path) -> Iterator[tuple[str, Path]]:
    state = tmp_path / "state.db"
    config = write_config(tmp_path / "cp.yaml", base_config(fleet_git, state))
    port = free_port()
    log = (tmp_path / "serve.log").open("w")
    process = subprocess.Popen([sys.executable, "-m", "fleetllm", "serve", "--config", str(config), "--listen",
                                f"127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT,
                               env={**os.environ, **ENV}, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{base}/health", timeout=2).close()
                break
            except (urllib.error.URLError, ConnectionError):
                if process.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError((tmp_path / "serve.log").read_text()) from None
                time.sleep(0.2)
        yield base, state
    finally:
        stop(process, timeout_s=15)
        log.close()


def rollout_cli(base: str, *args: str, token: str | None = ADMIN_TOKEN,
                tmp: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETLLM_")}
    env["FLEETLLM_URL"] = base
    if token is not None:
        env["FLEETLLM_ADMIN_TOKEN"] = token
    return subprocess.run([sys.executable, "-m", "fleetllm", "rollout", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)


def test_rollout_commands_through_the_admin_api(server: tuple[str, Path], fleet_git: Path, tmp_path: Path) -> None:
    base, state = server
    empty = rollout_cli(base, "status")
    assert empty.returncode == 0 and "no rollout yet" in empty.stdout
    refused = rollout_cli(base, "pause")
    assert refused.returncode == 1 and "fleetllm rollout: POST /admin/rollout/pause: HTTP 409" in refused.stderr
    assert rollout_cli(base, "status", token="not-a-token").returncode == 1
    no_token = rollout_cli(base, "status", token=None)
    assert no_token.returncode == 2 and "FLEETLLM_ADMIN_TOKEN" in no_token.stderr

    r1 = git(fleet_git, "rev-parse", "HEAD")
    store = open_store(f"sqlite:///{state}")
    try:
        store.save_rollout(Rollout(r1, RolloutState.HALTED, 1.0, 2.0, reason="box 203.0.113.24: crash loop", waves=1),
                           {KNOWN_BOX: BoxRelease(KNOWN_BOX, r1, r1, 2.0, BoxState.HALTED,
                                                  reason="box 203.0.113.24: crash loop")})
    finally:
        store.close()
    status = rollout_cli(base, "status")
    assert status.returncode == 0, status.stderr
    assert f"rollout of {r1[:12]}: halted, 1 wave(s)" in status.stdout
    assert "reason: box 203.0.113.24: crash loop" in status.stdout and KNOWN_BOX in status.stdout
    viewer = rollout_cli(base, "status", "--format", "json", token=VIEWER_TOKEN)
    assert json.loads(viewer.stdout)["rollout"]["state"] == "halted"
    assert rollout_cli(base, "pause", token=VIEWER_TOKEN).returncode == 1  # an admin's action
    resumed = rollout_cli(base, "resume")
    assert resumed.returncode == 0, resumed.stderr
    assert "resume requested by admin:" in resumed.stdout and "requested: resume" in resumed.stdout
    for output in (status, viewer, resumed, refused):
        assert ADMIN_TOKEN not in output.stdout + output.stderr and VIEWER_TOKEN not in output.stdout
    store = open_store(f"sqlite:///{state}")
    try:
        _, request, actor = store.current_rollout()
        assert request is not None and request.value == "resume" and actor is not None and actor.startswith("admin:")
    finally:
        store.close()


def test_the_server_process_serves_an_agent_box_its_released_revision(server: tuple[str, Path],
                                                                     fleet_git: Path) -> None:
    base, state = server
    r1 = git(fleet_git, "rev-parse", "HEAD")
    models = fleet_git / "models.yaml"
    models.write_text(models.read_text().replace("max-num-batched-tokens: 4096", "max-num-batched-tokens: 8192"))
    git(fleet_git, "commit", "-qam", "boot change")
    r2 = git(fleet_git, "rev-parse", "HEAD")
    hook = urllib.request.Request(f"{base}/hooks/push", data=b"{}", method="POST")
    import hashlib
    import hmac
    hook.add_header("X-Hub-Signature-256", "sha256=" + hmac.new(ENV["HOOK"].encode(), b"{}", hashlib.sha256).hexdigest())
    urllib.request.urlopen(hook, timeout=10).close()

    def config() -> dict[str, object]:
        request = urllib.request.Request(f"{base}/vllm/config", headers={"Authorization": f"Bearer {FLEET_KEY}",
                                                                          "X-LLMAO-Host": KNOWN_BOX})
        with urllib.request.urlopen(request, timeout=10) as response:
            body: dict[str, object] = json.loads(response.read())
            return body

    assert config()["revision"] == r2
    store = open_store(f"sqlite:///{state}")
    try:
        store.save_rollout(Rollout(r2, RolloutState.RUNNING, 1.0, 2.0),
                           {KNOWN_BOX: BoxRelease(KNOWN_BOX, r1, r1, 2.0, BoxState.WAITING)})
        store.record_report(BoxReport(KNOWN_BOX, 3.0, "127.0.0.1", r1, "test", ReportOutcome.INSTALLED,
                                      freeze_mapping({"agent": True})), keep=5)
    finally:
        store.close()
    time.sleep(1.2)  # config requests read the releases at most once a second
    assert config()["revision"] == r1
