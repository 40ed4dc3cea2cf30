"""The box agent's watch after an apply it reported as installed (issue 27's bad boot): the pure decision
`crashed` (supervisord's states and what was reported -> the servers to report failed, or none), the
restarts it counts (`observe`: a program that has not stayed up but never goes FATAL), and what it watches
(`watch_of`). Under a real supervisord with a server that crashes after the install was reported:
test_agent_supervisor.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fleetllm_contract.report import ServerState
from fleetllm_installer.agent import (
    CRASH_RESTARTS,
    CRASH_WINDOW_S,
    Seen,
    Watch,
    crashed,
    installer_args,
    observe,
    watch_of,
)
from fleetllm_installer.boxjson import parse_box
from fleetllm_installer.handover import ProgramStatus
from fleetllm_installer.main import Installer
from fleetllm_installer.settings import load
from tests.installer.conftest import BOX

PROGRAMS = {"small": "fleetllm-small", "large": "fleetllm-large"}


def shown(states: dict[str, str], pids: dict[str, int] | None = None) -> dict[str, ProgramStatus]:
    """supervisorctl status as the agent reads it: RUNNING programs with a pid (1000 unless given)."""
    pids = pids or {}
    return {program: ProgramStatus(state, pids.get(program, 1000) if state == "RUNNING" else None)
            for program, state in states.items()}


def looks(watch: Watch, views: list[dict[str, ProgramStatus]], every_s: float = 30.0,
          start: float = 0.0) -> tuple[list[dict[str, str]], Watch]:
    """`crashed` over one look per view, `every_s` apart: what each look reports, and the watch after."""
    reported = []
    for i, view in enumerate(views):
        new, watch = crashed(watch, view, start + i * every_s)
        reported.append(new)
    return reported, watch


def test_nothing_to_report_while_the_programs_run_or_start() -> None:
    watch = Watch(PROGRAMS)
    for states in ({"fleetllm-small": "RUNNING", "fleetllm-large": "STARTING"},
                   {"fleetllm-small": "RUNNING", "fleetllm-large": "BACKOFF"},
                   {"fleetllm-small": "EXITED"}, {}):
        new, after = crashed(watch, shown(states), 0.0)
        assert new == {}
        assert after.reported == frozenset()


def test_a_program_supervisord_gave_up_on_is_reported_once() -> None:
    states = shown({"fleetllm-small": "RUNNING", "fleetllm-large": "FATAL"})
    new, watch = crashed(Watch(PROGRAMS), states, 0.0)
    assert new == {"large": "supervisord gave up on fleetllm-large (FATAL)"}
    assert watch.reported == {"large"}
    for _ in range(3):  # the next polls find it FATAL still: nothing more
        new, watch = crashed(watch, states, 0.0)
        assert new == {}
    # the other one gives up later: a second failure, reported on its own
    new, watch = crashed(watch, shown({"fleetllm-small": "FATAL", "fleetllm-large": "FATAL"}), 0.0)
    assert set(new) == {"small"}
    assert watch.reported == {"small", "large"}


def test_a_failure_the_install_reported_is_not_reported_again() -> None:
    new, _ = crashed(Watch(PROGRAMS, frozenset({"large"})), shown({"fleetllm-large": "FATAL"}), 0.0)
    assert new == {}


def test_an_unanswered_status_forgets_nothing_and_a_restart_by_hand_rearms() -> None:
    watch = Watch(PROGRAMS, frozenset({"large"}))
    _, after = crashed(watch, {}, 0.0)  # supervisorctl answered nothing about it
    assert after.reported == {"large"}
    _, after = crashed(after, shown({"fleetllm-large": "RUNNING"}), 1.0)  # someone started it again
    assert after.reported == frozenset()
    new, after = crashed(after, shown({"fleetllm-large": "FATAL"}), 2.0)  # and it gave up again: a new failure
    assert set(new) == {"large"}


def test_programs_of_other_servers_are_not_looked_at() -> None:
    new, _ = crashed(Watch({"small": "fleetllm-small"}), shown({"fleetllm-other": "FATAL", "fleetllm-small": "RUNNING"}),
                     0.0)
    assert new == {}


def test_a_program_that_lives_past_startsecs_and_dies_again_is_reported_once() -> None:
    """RUNNING -> EXITED -> STARTING -> RUNNING for ever (autorestart): never FATAL. Each look finds another
    pid, or the program EXITED or STARTING; the third restart seen reports it, once, with what was seen."""
    cycle = [shown({"fleetllm-large": "RUNNING"}, {"fleetllm-large": 101}),
             shown({"fleetllm-large": "RUNNING"}, {"fleetllm-large": 102}),  # restarted between two looks
             shown({"fleetllm-large": "EXITED"}),
             shown({"fleetllm-large": "STARTING"}),
             shown({"fleetllm-large": "RUNNING"}, {"fleetllm-large": 103}),  # the same restart as EXITED
             shown({"fleetllm-large": "RUNNING"}, {"fleetllm-large": 104})]
    reported, watch = looks(Watch(PROGRAMS), cycle)
    assert [set(new) for new in reported] == [set(), set(), set(), set(), set(), {"large"}]
    assert reported[-1]["large"] == ("fleetllm-large did not stay up: 3 restarts seen in 120 s (supervisord "
                                     "showed RUNNING under a new pid, EXITED; it is RUNNING now)")
    assert watch.reported == {"large"}
    # It keeps cycling: reported once, not again while it keeps restarting.
    more = [shown({"fleetllm-large": "RUNNING"}, {"fleetllm-large": 105 + i}) for i in range(10)]
    again, watch = looks(watch, more, start=180.0)
    assert all(new == {} for new in again)
    assert watch.reported == {"large"}


def test_a_program_cycling_backoff_and_starting_is_reported_once() -> None:
    """A large startretries: BACKOFF -> STARTING -> BACKOFF, never RUNNING and never FATAL. Looks that find
    BACKOFF one after the other count one restart (nothing tells their BACKOFF periods apart)."""
    cycle = [shown({"fleetllm-small": state})
             for state in ("BACKOFF", "BACKOFF", "STARTING", "BACKOFF", "BACKOFF", "STARTING", "BACKOFF", "STARTING")]
    reported, watch = looks(Watch(PROGRAMS), cycle)
    assert [set(new) for new in reported] == [set(), set(), set(), set(), set(), set(), {"small"}, set()]
    assert "fleetllm-small did not stay up: 3 restarts seen in 180 s" in reported[6]["small"]
    assert "supervisord showed BACKOFF; it is BACKOFF now" in reported[6]["small"]
    assert watch.reported == {"small"}


def test_a_program_restarted_once_or_now_and_then_is_not_reported() -> None:
    """One restart (by hand, or one crash) is not a crash loop, nor are restarts further apart than the window."""
    one = [shown({"fleetllm-large": "RUNNING"}, {"fleetllm-large": 101}),
           shown({"fleetllm-large": "STARTING"}),
           shown({"fleetllm-large": "STARTING"}),
           shown({"fleetllm-large": "RUNNING"}, {"fleetllm-large": 102})] + [
           shown({"fleetllm-large": "RUNNING"}, {"fleetllm-large": 102})] * 10
    reported, watch = looks(Watch(PROGRAMS), one)
    assert all(new == {} for new in reported)
    assert len(watch.seen["large"].restarts) == 1
    apart = [shown({"fleetllm-large": "RUNNING"}, {"fleetllm-large": 200 + i}) for i in range(CRASH_RESTARTS * 3)]
    reported, watch = looks(Watch(PROGRAMS), apart, every_s=CRASH_WINDOW_S / (CRASH_RESTARTS - 1))
    assert all(new == {} for new in reported)
    assert len(watch.seen["large"].restarts) == CRASH_RESTARTS - 1  # the window holds one fewer than reports


def test_a_reported_crash_loop_rearms_once_it_stayed_up_for_the_window() -> None:
    cycle = [shown({"fleetllm-large": "RUNNING"}, {"fleetllm-large": 300 + i}) for i in range(CRASH_RESTARTS + 1)]
    reported, watch = looks(Watch(PROGRAMS), cycle)
    assert set(reported[-1]) == {"large"}
    steady = [shown({"fleetllm-large": "RUNNING"}, {"fleetllm-large": 400})] * 25  # fixed: it stays up
    _, watch = looks(watch, steady, start=120.0)
    assert watch.reported == frozenset()  # 25 looks 30 s apart: the window passed with no restart
    again = [shown({"fleetllm-large": "RUNNING"}, {"fleetllm-large": 500 + i}) for i in range(CRASH_RESTARTS)]
    reported, watch = looks(watch, again, start=1000.0)
    assert set(reported[-1]) == {"large"}  # a new crash loop is a new failure


def test_observe_counts_one_restart_per_process_that_ended() -> None:
    seen = observe(Seen(), ProgramStatus("RUNNING", 7), 0.0)
    assert seen == Seen("RUNNING", pid=7)
    seen = observe(seen, ProgramStatus("EXITED"), 1.0)
    seen = observe(seen, ProgramStatus("EXITED"), 2.0)  # still the same end
    seen = observe(seen, ProgramStatus("RUNNING", 8), 3.0)  # its restart: counted at EXITED already
    assert seen.restarts == ((1.0, "EXITED"),)
    assert observe(seen, ProgramStatus("RUNNING", 8), CRASH_WINDOW_S + 1.0).restarts == ()


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
