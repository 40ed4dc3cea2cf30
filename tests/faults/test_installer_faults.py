"""The box installer under faults, with real parts: installer/fleetllm_installer/provision/vast.sh, the box program it
downloads, the real control plane process, real supervisord running the stub vLLM.

- the control plane is down when the box boots: the download is retried, then fails saying why; when
  the control plane comes back within the retry budget, the box installs;
- a fit shortfall (GPUs too small): the install fails, writes no program, and reports `fit_failed`;
- a server that crashes while loading: Supervisor gives up (FATAL), the box's report says so, and
  the reconciler judges the server Stalled, with the reason.
In process, with a fake control plane: a truncated or otherwise bad box JSON
(tests/installer/test_main.py::test_bad_json_fails_and_is_reported), supervisord not running
(::test_update_without_a_running_supervisord_fails_and_is_reported), retries and deadline of the
config fetch (tests/installer/test_fetch.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import git
from tests.installer.realprocs import wait_until
from tests.support.box import Box
from tests.support.plane import FLEETLLM, ControlPlane, free_port

from .conftest import FLEET_KEY, PLANE_ENV, plane_document, viewer

BOX = "127.0.0.7"
pytestmark = pytest.mark.slow


def fleet_repo(root: Path, port: int, grace_s: int = 600) -> Path:
    repo = root / "fleet"
    repo.mkdir()
    (repo / "fleet.yaml").write_text(f"version: 1\nfleet_id: test-fleet\nlisten_ports: [{port}]\n"
                                     f"reconcile: {{health_grace_s: {grace_s}, probe_timeout_s: 2}}\n"
                                     "rollout: {mode: manual}\n")  # the installer's own failures, no agent
    (repo / "models.yaml").write_text(
        "models:\n  tiny-a:\n    vllm: {model: org/tiny-a, max_model_len: 4096, vram_gb: 20, disk_gb: 1}\n")
    (repo / "placement.yaml").write_text(f"hosts:\n  '{BOX}':\n    provider: static\n    servers:\n"
                                         f"      - [tiny-a, {port}]\n")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "one box")
    return repo


@pytest.fixture
def make_box(tmp_path: Path) -> Iterator[Callable[..., Box]]:
    made: list[Box] = []

    def make(name: str = "box", stub_env: dict[str, str] | None = None) -> Box:
        made.append(Box(BOX, tmp_path / name, stub_env))
        return made[-1]

    yield make
    for box in made:
        box.stop()


def test_control_plane_down_at_boot_retried_then_a_clear_failure_or_an_install(
        tmp_path: Path, make_box: Callable[..., Box], figures: Callable[..., None]) -> None:
    port = free_port(BOX)
    box = make_box()
    dead = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    done = box.provision(dead, FLEET_KEY, FLEETLLM_FETCH_DEADLINE_S="4")
    gave_up_after = round(time.monotonic() - started, 1)
    assert done.returncode != 0
    retries = done.stderr.count("retrying in")
    assert retries >= 1, done.stderr
    assert "Connection refused" in done.stderr and "gave up after" in done.stderr, done.stderr
    assert not list((box.root / "conf.d").glob("fleetllm-*.conf"))

    # The control plane comes up 3 s into the box's boot: the retries carry the install through.
    plane = ControlPlane(tmp_path / "plane", plane_document(tmp_path / "state", repo_path=fleet_repo(tmp_path, port)),
                         dict(PLANE_ENV))
    late = threading.Timer(3.0, plane.start)
    late.start()
    try:
        done = box.provision(plane.url, FLEET_KEY, FLEETLLM_FETCH_DEADLINE_S="60")
        late.join()
        assert done.returncode == 0, done.stderr
        assert "retrying in" in done.stderr
        wait_until("the server under supervisord", lambda: "RUNNING" in box.supervisor.ctl("status"), 60)
    finally:
        late.cancel()
        plane.stop()
    figures(case="control plane down at boot", retries_before_giving_up=retries, gave_up_after_s=gave_up_after,
            deadline_s=4, installed_after_late_start=True)


def test_fit_shortfall_and_a_crash_while_loading(tmp_path: Path, make_box: Callable[..., Box],
                                                 start_plane: Callable[..., ControlPlane],
                                                 figures: Callable[..., None]) -> None:
    port = free_port(BOX)
    repo = fleet_repo(tmp_path, port, grace_s=2)
    plane = start_plane(plane_document(tmp_path / "state", repo_path=repo,
                                       litellm={"url": f"http://127.0.0.1:{free_port()}", "master_key": "${env:FK}"},
                                       providers={"static": {}}))

    # A GPU too small for the model's 20 GB: nothing written, fit_failed reported.
    small = make_box("small")
    done = small.provision(plane.url, FLEET_KEY, FAKE_NVIDIA_SMI_GPUS="NVIDIA T4:15360:15000")
    assert done.returncode == 1
    assert "will not fit" in done.stderr, done.stderr
    assert not list((small.root / "conf.d").glob("fleetllm-*.conf"))
    _, reports = plane.json("/admin/reports", viewer())
    report = reports["boxes"][BOX]
    assert report["outcome"] == "fit_failed" and "will not fit" in report["report"]["message"]
    small.stop()

    # The server crashes at the end of every load: Supervisor retries, then gives up.
    crashy = make_box("crashy", {"STUB_VLLM_FAIL_LOAD": "1", "STUB_VLLM_LOAD_S": "0.2"})
    started = time.monotonic()
    done = crashy.provision(plane.url, FLEET_KEY, FLEETLLM_STARTSECS="5")  # every crash is a failed start
    assert done.returncode == 0, done.stderr  # the install itself went through
    states = crashy.supervisor.states()
    assert list(states.values()) == ["FATAL"], (states, done.stderr)
    _, reports = plane.json("/admin/reports", viewer())
    report = reports["boxes"][BOX]["report"]
    assert [s["state"] for s in report["servers"]] == ["failed"], report
    assert "FATAL" in report["message"], report["message"]
    reported_after = round(time.monotonic() - started, 1)

    # The reconciler: past the grace period, Stalled, saying why.
    time.sleep(2.5)
    plan = subprocess.run([str(FLEETLLM), "plan", "--config", str(plane.config)], capture_output=True, text=True,
                          env={"PATH": os.environ["PATH"], "HOME": str(tmp_path), **PLANE_ENV}, cwd=tmp_path,
                          timeout=120, check=False)
    line = next((x for x in plan.stdout.splitlines() if f"{BOX}:{port}" in x), plan.stdout + plan.stderr)
    assert "Stalled" in line, line
    assert "never healthy within 2s" in line and "the box reports" in line, line
    figures(case="crash while loading", supervisor=list(states.values()), reported_after_s=reported_after,
            verdict=" ".join(line.split()[2:]))
    json.dumps(report)
