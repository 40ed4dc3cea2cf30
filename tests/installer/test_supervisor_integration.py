"""The installer against a real supervisord (from PyPI) with the stub vLLM on PATH as `vllm`, on loopback.

One supervisord per test, in a temp dir with its own unix socket; every process is stopped at the end.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest

from fleetllm_installer.main import main
from tests.installer.conftest import BOX, FakeControlPlane, render, write_fleet
from tests.installer.realprocs import Supervisor, http_status, pid_alive, wait_until

pytestmark = pytest.mark.slow
@pytest.fixture
def plane(control_plane: FakeControlPlane, monkeypatch: pytest.MonkeyPatch) -> FakeControlPlane:
    monkeypatch.setenv("FLEETLLM_URL", control_plane.url)
    return control_plane


def servers_by_name(box_json: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["name"]: s for s in box_json["servers"]}


def healthy(server: dict[str, Any]) -> bool:
    return http_status(f"http://127.0.0.1:{server['port']}/health") == 200


def test_units_start_in_order_serve_with_the_bearer_and_restart(supervisor: Supervisor, plane: FakeControlPlane,
                                                                box_json: dict[str, Any]) -> None:
    assert main(["--handover", "update"]) == 0
    servers = servers_by_name(box_json)
    wait_until("both servers healthy", lambda: all(healthy(s) for s in servers.values()))
    wait_until("both programs RUNNING", lambda: set(supervisor.states().values()) == {"RUNNING"})
    assert set(supervisor.states()) == {"fleetllm-large", "fleetllm-small"}
    (report,) = plane.reports
    assert report["outcome"] == "installed"
    assert {s["state"] for s in report["servers"]} == {"started"}

    # Start-up ordering: "large" sorts first; "small" shares the card and execs vLLM only once large serves.
    events = supervisor.read_events()
    large_serving = next(e["time"] for e in events if e["event"] == "serving" and e["served_model_name"] == "large")
    small_start = next(e["time"] for e in events if e["event"] == "start" and e["served_model_name"] == "small")
    assert small_start >= large_serving
    small_log = (Path(os.environ["FLEETLLM_DATA_DIR"]) / "fleetllm" / "logs" / "small.log").read_text()
    assert "small: waiting for large to answer /health" in small_log
    assert "small: large healthy" in small_log

    # The bearer reached vLLM through the environment: /v1/models needs it.
    for server in servers.values():
        models = f"http://127.0.0.1:{server['port']}/v1/models"
        assert http_status(models) == 401
        assert http_status(models, server["api_key"]) == 200
        assert next(e for e in events if e["event"] == "start" and e["port"] == server["port"])["api_key_set"]

    # ... and never through any command line.
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes()
        except OSError:
            continue
        for server in servers.values():
            assert server["api_key"].encode() not in text, f"bearer in {cmdline}"

    # A killed server is restarted by Supervisor.
    small_port = servers["small"]["port"]
    (first_pid,) = supervisor.pids(small_port)
    os.kill(first_pid, signal.SIGKILL)
    wait_until("a second small process", lambda: len(supervisor.pids(small_port)) == 2)
    wait_until("small healthy again", lambda: healthy(servers["small"]))
    assert supervisor.pids(small_port)[1] != first_pid


def test_second_run_replaces_changed_and_removes_dropped_units(supervisor: Supervisor, plane: FakeControlPlane,
                                                               box_json: dict[str, Any], ports: list[int],
                                                               tmp_path: Path) -> None:
    assert main(["--handover", "update"]) == 0
    old = servers_by_name(box_json)
    wait_until("both servers healthy", lambda: all(healthy(s) for s in old.values()))
    (large_pid,) = supervisor.pids(old["large"]["port"])
    (small_pid,) = supervisor.pids(old["small"]["port"])

    # The same JSON again (a re-provisioned box): nothing is restarted (`update` stops synchronously).
    assert main(["--handover", "update"]) == 0
    assert pid_alive(large_pid)
    assert pid_alive(small_pid)
    assert plane.reports[-1]["units_removed"] == []

    # New revision: "large" leaves the box, a second process of "small" arrives on the third port.
    fleet = write_fleet(tmp_path / "fleet2", ports, [("small", ports[0], None), ("small", ports[2], "small-b")])
    plane.boxes[BOX] = render(fleet)
    assert main(["--handover", "update"]) == 0
    new = servers_by_name(plane.boxes[BOX])

    wait_until("fleetllm-large gone", lambda: "fleetllm-large" not in supervisor.states())
    wait_until("large's process stopped", lambda: not pid_alive(large_pid))
    conf_files = sorted(p.name for p in (tmp_path / "conf.d").iterdir())
    assert conf_files == ["fleetllm-small-b.conf", "fleetllm-small.conf"]
    wait_until("small-b healthy", lambda: healthy(new["small-b"]))
    assert http_status(f"http://127.0.0.1:{new['small-b']['port']}/v1/models", new["small-b"]["api_key"]) == 200
    assert plane.reports[-1]["units_removed"] == ["fleetllm-large"]
    # small-b fits in what large left, so small keeps its share of the card and is not restarted
    # (tests/installer/test_stable_division.py has the case where the new set does not fit).
    assert pid_alive(small_pid)
    assert supervisor.pids(old["small"]["port"]) == [small_pid]
    assert set(supervisor.states()) == {"fleetllm-small", "fleetllm-small-b"}
