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


def wait_cli(base: str, *args: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETLLM_")}
    env.update({"FLEETLLM_URL": base, "FLEETLLM_VIEWER_TOKEN": VIEWER_TOKEN})  # waiting only reads
    return subprocess.Popen([sys.executable, "-m", "fleetllm", "rollout", "wait", *args, "--interval", "0.3"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_rollout_wait_exits_0_when_converged_1_when_halted_2_at_the_timeout(server: tuple[str, Path],
                                                                            fleet_git: Path) -> None:
    """`fleetllm rollout wait` against the real control plane, while the state store moves as a reconcile
    pass moves it: started, then converged (0); a later commit started, then halted (1); a finished
    rollout waited for later keeps its outcome (0); a revision that never starts (2); not a commit id (2)."""
    base, state = server
    r1, r2 = git(fleet_git, "rev-parse", "HEAD"), "2" * 40
    store = open_store(f"sqlite:///{state}")

    def save(target: str, rollout_state: RolloutState, box_state: BoxState, reason: str = "") -> None:
        store.save_rollout(Rollout(target, rollout_state, 1.0, time.time(), reason=reason, waves=1),
                           {KNOWN_BOX: BoxRelease(KNOWN_BOX, target, r1, 2.0, box_state, reason=reason)})

    def seen(process: subprocess.Popen[str], text: str) -> None:
        """Until the waiting process has printed `text` (it prints a line each time the rollout changes)."""
        assert process.stdout is not None
        lines = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = process.stdout.readline()
            lines.append(line)
            if text in line:
                return
            if not line and process.poll() is not None:
                break
        raise AssertionError(f"never printed {text!r}: {lines}")

    try:
        converging = wait_cli(base, r1[:10], "--timeout", "120")
        seen(converging, f"the rollout of {r1[:10]} has not started")
        save(r1, RolloutState.RUNNING, BoxState.RELEASED)
        seen(converging, f"rollout of {r1[:12]}: running, 1 wave(s); boxes: 1 released")
        save(r1, RolloutState.CONVERGED, BoxState.APPLIED)
        out, err = converging.communicate(timeout=60)
        assert converging.returncode == 0, (out, err)
        assert f"converged: every agent-managed box runs {r1[:12]}" in out

        halting = wait_cli(base, "--timeout", "120")  # no revision: the one under way, r2
        save(r2, RolloutState.RUNNING, BoxState.RELEASED)
        seen(halting, f"rollout of {r2[:12]}: running")
        save(r2, RolloutState.HALTED, BoxState.HALTED, reason=f"box {KNOWN_BOX}: install failed; rolled back to r1")
        out, err = halting.communicate(timeout=60)
        assert halting.returncode == 1, (out, err)
        assert f"halted: box {KNOWN_BOX}: install failed; rolled back to r1" in out

        still = subprocess.run([sys.executable, "-m", "fleetllm", "rollout", "wait", r1, "--timeout", "5"], cwd=ROOT,
                               env={**os.environ, "FLEETLLM_URL": base, "FLEETLLM_VIEWER_TOKEN": VIEWER_TOKEN},
                               capture_output=True, text=True, timeout=60)
        assert still.returncode == 0 and "converged: every agent-managed box ran" in still.stdout  # history
        never = subprocess.run([sys.executable, "-m", "fleetllm", "rollout", "wait", "abcdef0", "--timeout", "1",
                                "--interval", "0.3"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                               env={**os.environ, "FLEETLLM_URL": base, "FLEETLLM_VIEWER_TOKEN": VIEWER_TOKEN})
        assert never.returncode == 2 and "timed out after 1 s" in never.stdout
        usage = subprocess.run([sys.executable, "-m", "fleetllm", "rollout", "wait", "main"], cwd=ROOT,
                               env={**os.environ, "FLEETLLM_URL": base, "FLEETLLM_VIEWER_TOKEN": VIEWER_TOKEN},
                               capture_output=True, text=True, timeout=60)
        assert usage.returncode == 2 and "is not a commit id" in usage.stderr
        for output in (out, err, still.stdout, never.stdout, usage.stderr):
            assert VIEWER_TOKEN not in output and ADMIN_TOKEN not in output
    finally:
        store.close()


def test_rollout_forget_through_the_cli(server: tuple[str, Path], fleet_git: Path) -> None:
    """`fleetllm rollout forget BOX` (issue 25): a box that left the placement (known by its report) is retired
    at once and answered 404; a placed box is refused; BOX is required."""
    base, state = server
    gone = "198.51.100.99"
    r1 = git(fleet_git, "rev-parse", "HEAD")
    store = open_store(f"sqlite:///{state}")
    try:
        store.record_report(BoxReport(gone, 1.0, gone, r1, "test", ReportOutcome.INSTALLED,
                                      freeze_mapping({"agent": True})), keep=5)
        store.save_rollout(Rollout(r1, RolloutState.RUNNING, 1.0, 2.0),
                           {gone: BoxRelease(gone, r1, r1, 2.0, BoxState.WAITING)})
    finally:
        store.close()
    assert rollout_cli(base, "forget").returncode == 2
    placed = rollout_cli(base, "forget", KNOWN_BOX)
    assert placed.returncode == 1 and "HTTP 409" in placed.stderr and "placement.yaml" in placed.stderr
    done = rollout_cli(base, "forget", gone)
    assert done.returncode == 0, done.stderr
    assert f"box {gone} forgotten by admin:" in done.stdout and "answers it 404" in done.stdout
    status = rollout_cli(base, "status")
    assert f"{gone}  retired" in status.stdout and "forgotten by admin:" in status.stdout, status.stdout
    store = open_store(f"sqlite:///{state}")
    try:
        assert store.box_release(gone) is None
        assert str(store.control_audit(1)[0].action) == "rollout-forget"
    finally:
        store.close()
    headers = {"Authorization": f"Bearer {FLEET_KEY}", "X-LLMAO-Host": gone}
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(urllib.request.Request(f"{base}/vllm/config", headers=headers), timeout=10)
    assert refused.value.code == 404 and "was retired" in refused.value.read().decode()
