"""The box agent's watch after an apply it reported as installed (issue 27's bad boot): the pure decision
`crashed` (supervisord's states and what was reported -> the servers to report failed, or none), and what
it watches (`watch_of`). Under a real supervisord with a server that crashes after the install was
reported: test_agent_supervisor.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fleetllm_contract.report import ServerState
from fleetllm_installer.agent import Watch, crashed, installer_args, watch_of
from fleetllm_installer.boxjson import parse_box
from fleetllm_installer.main import Installer
from fleetllm_installer.settings import load
from tests.installer.conftest import BOX

PROGRAMS = {"small": "fleetllm-small", "large": "fleetllm-large"}


def test_nothing_to_report_while_the_programs_run_or_start() -> None:
    watch = Watch(PROGRAMS)
    for states in ({"fleetllm-small": "RUNNING", "fleetllm-large": "STARTING"},
                   {"fleetllm-small": "RUNNING", "fleetllm-large": "BACKOFF"},
                   {"fleetllm-small": "EXITED"}, {}):
        new, after = crashed(watch, states)
        assert new == frozenset()
        assert after == watch


def test_a_program_supervisord_gave_up_on_is_reported_once() -> None:
    states = {"fleetllm-small": "RUNNING", "fleetllm-large": "FATAL"}
    new, watch = crashed(Watch(PROGRAMS), states)
    assert new == {"large"}
    assert watch.reported == {"large"}
    for _ in range(3):  # the next polls find it FATAL still: nothing more
        new, watch = crashed(watch, states)
        assert new == frozenset()
    # the other one gives up later: a second failure, reported on its own
    new, watch = crashed(watch, {"fleetllm-small": "FATAL", "fleetllm-large": "FATAL"})
    assert new == {"small"}
    assert watch.reported == {"small", "large"}


def test_a_failure_the_install_reported_is_not_reported_again() -> None:
    new, _ = crashed(Watch(PROGRAMS, frozenset({"large"})), {"fleetllm-large": "FATAL"})
    assert new == frozenset()


def test_an_unanswered_status_forgets_nothing_and_a_restart_by_hand_rearms() -> None:
    watch = Watch(PROGRAMS, frozenset({"large"}))
    _, after = crashed(watch, {})  # supervisorctl answered nothing about it
    assert after.reported == {"large"}
    _, after = crashed(after, {"fleetllm-large": "RUNNING"})  # someone started it again
    assert after.reported == frozenset()
    new, after = crashed(after, {"fleetllm-large": "FATAL"})  # and it gave up again: a new failure
    assert new == {"large"}


def test_programs_of_other_servers_are_not_looked_at() -> None:
    new, _ = crashed(Watch({"small": "fleetllm-small"}), {"fleetllm-other": "FATAL", "fleetllm-small": "RUNNING"})
    assert new == frozenset()


def test_the_watch_holds_the_servers_and_gateway_and_what_the_install_reported(
        box_json: dict[str, Any], box_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEETLLM_URL", "http://127.0.0.1:9")
    box = parse_box(box_json, BOX)
    installer = Installer(installer_args(), load())
    installer.box = box
    names = [s.name for s in box.servers]
    installer.states = {names[0]: ServerState.STARTED, names[1]: ServerState.FAILED}
    watch = watch_of(installer)
    assert watch is not None
    assert dict(watch.programs) == {name: f"fleetllm-{name}" for name in names}
    assert watch.reported == {names[1]}
    installer.box = parse_box({**box_json, "servers": []}, BOX)  # a retiring box: nothing to watch
    assert watch_of(installer) is None
