"""Stable card division against a real supervisord (issue 14, item 4): a server added to (or removed from)
a card does not restart its unchanged neighbours while the new set fits around their current shares, and
does restart them when it cannot (the card is divided afresh).

The fake nvidia-smi reports one 80 GB card (79.6 GiB); "small" needs 10 GB of weights, "large" 30 GB.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fleetllm_installer.main import main
from tests.installer.conftest import BOX, FakeControlPlane, render, write_fleet
from tests.installer.realprocs import Supervisor, http_status, pid_alive, wait_until

pytestmark = pytest.mark.slow


def utilization(supervisor: Supervisor, pid: int) -> str:
    start = next(e for e in supervisor.read_events() if e["event"] == "start" and e["pid"] == pid)
    argv: list[str] = start["argv"]
    return argv[argv.index("--gpu-memory-utilization") + 1]


def healthy(server: dict[str, Any]) -> bool:
    return http_status(f"http://127.0.0.1:{server['port']}/health") == 200


def install(plane: FakeControlPlane, fleet: Path) -> dict[str, dict[str, Any]]:
    plane.boxes[BOX] = render(fleet)
    assert main(["--handover", "update"]) == 0
    servers = {s["name"]: s for s in plane.boxes[BOX]["servers"]}
    wait_until("every server healthy", lambda: all(healthy(s) for s in servers.values()))
    return servers


@pytest.fixture
def plane(control_plane: FakeControlPlane, monkeypatch: pytest.MonkeyPatch) -> FakeControlPlane:
    monkeypatch.setenv("FLEETLLM_URL", control_plane.url)
    return control_plane


def test_a_server_that_fits_around_the_running_shares_restarts_no_neighbour(
        supervisor: Supervisor, plane: FakeControlPlane, ports: list[int], tmp_path: Path) -> None:
    both = install(plane, write_fleet(tmp_path / "f1", ports, [("small", ports[0], None), ("large", ports[1], None)]))
    (small_pid,) = supervisor.pids(both["small"]["port"])
    (large_pid,) = supervisor.pids(both["large"]["port"])
    share = utilization(supervisor, small_pid)
    assert share == "0.324"  # (10 + (0.9 x 79.6 - 40) / 2) / 79.6, rounded down

    # large leaves: small keeps its share (the freed memory waits for the next server) and its process
    install(plane, write_fleet(tmp_path / "f2", ports, [("small", ports[0], None)]))
    wait_until("large stopped", lambda: not pid_alive(large_pid))
    assert supervisor.pids(both["small"]["port"]) == [small_pid]
    assert pid_alive(small_pid)

    # a second small process arrives on a free port: it takes what large left; small still runs as it was
    after = install(plane, write_fleet(tmp_path / "f3", ports, [("small", ports[0], None),
                                                                 ("small", ports[2], "small-b")]))
    (b_pid,) = supervisor.pids(after["small-b"]["port"])
    assert float(utilization(supervisor, b_pid)) == pytest.approx(0.9 - 0.324, abs=0.002)
    assert supervisor.pids(both["small"]["port"]) == [small_pid]
    assert pid_alive(small_pid)
    assert set(supervisor.states().values()) == {"RUNNING"}
    # small's program still names large (it did not change); the launcher would not wait for it
    present = (tmp_path / "data" / "fleetllm" / "bin" / "servers").read_text().split()
    assert sorted(present) == sorted([f"small={ports[0]}", f"small-b={ports[2]}"])


def test_a_server_that_does_not_fit_redivides_the_card_and_restarts_the_neighbour(
        supervisor: Supervisor, plane: FakeControlPlane, ports: list[int], tmp_path: Path) -> None:
    alone = install(plane, write_fleet(tmp_path / "f1", ports, [("small", ports[0], None)]))
    (small_pid,) = supervisor.pids(alone["small"]["port"])
    assert utilization(supervisor, small_pid) == "0.9"  # the whole usable card

    both = install(plane, write_fleet(tmp_path / "f2", ports, [("small", ports[0], None), ("large", ports[1], None)]))
    wait_until("small restarted", lambda: len(supervisor.pids(both["small"]["port"])) == 2)
    assert not pid_alive(small_pid)
    restarted = supervisor.pids(both["small"]["port"])[1]
    assert utilization(supervisor, restarted) == "0.324"
    (large_pid,) = supervisor.pids(both["large"]["port"])
    assert utilization(supervisor, large_pid) == "0.575"
