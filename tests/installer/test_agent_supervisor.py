"""The installer installs and removes the box agent under a real supervisord (from PyPI): the program runs
the agent from its copy of the box program; a JSON without `agent` stops and removes it and its files;
the report says `agent` only while the agent runs. An apply that supervisord refuses is tried
again, not taken as applied. A server that crash-loops after the agent reported the apply installed is
reported failed, once (issue 27's bad boot), whether supervisord gives up on it (FATAL) or keeps restarting
it (it lives past startsecs and dies again: never FATAL)."""

from __future__ import annotations

import copy
import json
import os
import signal
import stat
from pathlib import Path
from typing import Any

import pytest

from fleetllm.job.rollout import report_facts
from fleetllm.server.reports import parse_report
from fleetllm_installer import agent as agent_module
from fleetllm_installer.agent import USER_AGENT, Agent
from fleetllm_installer.fetch import Client
from fleetllm_installer.handover import install_lock, update_later
from fleetllm_installer.main import main
from fleetllm_installer.settings import load
from tests.installer.conftest import BOX, FLEET_KEY, STUB_VLLM, FakeControlPlane
from tests.installer.realprocs import Supervisor, pid_alive, wait_until, write_supervisord_conf

pytestmark = pytest.mark.slow


def with_agent(box_json: dict[str, Any], poll_s: int = 3600) -> dict[str, Any]:
    return {**copy.deepcopy(box_json), "agent": {"poll_s": poll_s}}


@pytest.fixture
def plane(control_plane: FakeControlPlane, box_json: dict[str, Any], box_env: Path,
          monkeypatch: pytest.MonkeyPatch) -> FakeControlPlane:
    control_plane.boxes[BOX] = with_agent(box_json)
    monkeypatch.setenv("FLEETLLM_URL", control_plane.url)
    return control_plane


def test_installer_installs_then_removes_the_agent(supervisor: Supervisor, plane: FakeControlPlane,
                                                   box_json: dict[str, Any], box_env: Path) -> None:
    assert main(["--handover", "update"]) == 0
    assert plane.reports[-1]["agent"] is True
    wait_until("the agent RUNNING", lambda: supervisor.states().get("fleetllm-agent") == "RUNNING", 60)
    settings = load()
    key = settings.agent_credentials_dir / "fleet-key"
    assert key.read_text().strip() == FLEET_KEY
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert stat.S_IMODE(settings.agent_credentials_dir.stat().st_mode) == 0o700
    assert settings.agent_program_path.is_file()
    assert settings.agent_state_path.is_file()
    agent_pid = supervisor.pid("fleetllm-agent")
    # Its first poll finds the config the installer applied: nothing applied, nothing reported.
    wait_until("the agent's first poll", lambda: len([r for r in plane.requests
                                                      if r["headers"].get("user-agent") == USER_AGENT]) >= 1, 60)
    assert len(plane.reports) == 1

    # The same JSON again (a re-provisioned box): the agent keeps running, not restarted.
    assert main(["--handover", "update"]) == 0
    assert supervisor.pid("fleetllm-agent") == agent_pid

    # The JSON drops the agent: it is stopped and removed, and reported without `agent`. Either the
    # installer run removes it, or the agent itself does when its poll comes first (its first poll may
    # have found the first run's install lock held and be looking again 5 s later): exactly one of the
    # reports after the change says the program was removed, and none says `agent`.
    reports_before = len(plane.reports)
    plane.boxes[BOX] = copy.deepcopy(box_json)
    assert main(["--handover", "update"]) == 0
    after = plane.reports[reports_before:]
    assert after and all("agent" not in report for report in after)
    assert len([report for report in after if "fleetllm-agent" in report["units_removed"]]) == 1
    assert "fleetllm-agent" not in supervisor.states()
    wait_until("the agent process gone", lambda: not pid_alive(agent_pid), 30)
    assert not key.exists()
    assert not settings.agent_state_path.exists()
    assert not settings.agent_program_path.exists()
    assert not (settings.conf_dir / "fleetllm-agent.conf").exists()


def test_an_apply_supervisord_refuses_is_tried_again(plane: FakeControlPlane, box_env: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    socketless = tmp_path / "no-supervisord"
    socketless.mkdir()
    config = write_supervisord_conf(socketless, socketless, tmp_path / "conf.d")  # nothing listens there
    monkeypatch.setenv("FLEETLLM_SUPERVISOR_CONFIG", str(config))
    settings = load()
    assert settings.url is not None
    agent = Agent(settings, Client(settings.url, FLEET_KEY, BOX, deadline_s=0.0, user_agent=USER_AGENT),
                  uniform=lambda low, high: 1.0)
    first = agent.poll()
    assert first.result == "retry"
    assert agent.failures == 1
    assert agent.applied is None
    assert plane.reports[-1]["outcome"] == "failed"
    assert "supervisorctl" in plane.reports[-1]["message"]
    second = agent.poll()  # the same body: applied again, not skipped as done
    assert second.result == "retry"
    assert agent.failures == 2
    assert agent.next_delay() == 4 * agent.poll_s
    assert os.environ["FLEETLLM_SUPERVISOR_CONFIG"] == str(config)


def test_the_agent_leaves_its_own_restart_to_a_detached_update(supervisor: Supervisor, plane: FakeControlPlane,
                                                               box_json: dict[str, Any],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """An apply whose settings change the agent's own program (here: another startsecs) updates every
    other program itself and has supervisord restart the agent afterwards, so the agent is never
    stopped in the middle of its own `supervisorctl update`."""
    assert main(["--handover", "update"]) == 0
    wait_until("the agent RUNNING", lambda: supervisor.states().get("fleetllm-agent") == "RUNNING", 60)
    agent_pid = supervisor.pid("fleetllm-agent")
    assert agent_pid, "the agent has a pid (SIGSTOP to 0 would stop this test's own process group)"
    # The agent under supervisord is a second agent on this box. Its first poll found main()'s install
    # lock held and looks again about 5 s later: after the JSON below changes it would apply it itself,
    # and this test's agent find the lock held ("busy") or the config applied ("same"). So it is frozen
    # (SIGSTOP) while this test's agent applies, taken with the install lock held: between polls, never
    # in an apply. Its pid and program stay; supervisord restarts it below.
    with install_lock(load(), 60):
        os.kill(agent_pid, signal.SIGSTOP)
    try:
        applied_by_this_agent(supervisor, plane, agent_pid, monkeypatch)
    finally:
        os.kill(agent_pid, signal.SIGCONT)
    update_later(load(), "fleetllm-agent")  # what the agent started, in its own session
    wait_until("the agent restarted by supervisord", lambda: supervisor.states().get("fleetllm-agent") == "RUNNING"
               and supervisor.pid("fleetllm-agent") not in (0, agent_pid), 60)
    assert not pid_alive(agent_pid)


def applied_by_this_agent(supervisor: Supervisor, plane: FakeControlPlane, agent_pid: int,
                          monkeypatch: pytest.MonkeyPatch) -> None:
    plane.boxes[BOX] = {**plane.boxes[BOX], "revision": "a-new-revision"}
    monkeypatch.setenv("FLEETLLM_STARTSECS", "2")
    settings = load()
    assert settings.url is not None
    agent = Agent(settings, Client(settings.url, FLEET_KEY, BOX, deadline_s=0.0, user_agent=USER_AGENT),
                  uniform=lambda low, high: 1.0)
    later: list[str] = []
    monkeypatch.setattr(agent_module, "update_later", lambda settings, group: later.append(group))
    outcome = agent.poll()
    assert outcome.result == "applied"
    assert plane.reports[-1]["revision"] == "a-new-revision"
    assert plane.reports[-1]["agent"] is True
    assert later == ["fleetllm-agent"]
    assert supervisor.pid("fleetllm-agent") == agent_pid  # its own update left it alone
    assert "fleetllm-agent: changed" in supervisor.ctl("reread")


def agent_with_crashing_server(tool_bin: Path, port: int, script: str) -> Agent:
    """An agent of the box whose `vllm` runs the shell `script` for the server on `port` (the stub for the
    others); it polls the fake control plane of FLEETLLM_URL."""
    (tool_bin / "vllm").unlink()
    (tool_bin / "vllm").write_text(
        "#!/bin/sh\n"
        f"case \" $* \" in *\" --port {port} \"*) {script};;\n"
        "esac\n"
        f"exec {STUB_VLLM} \"$@\"\n")
    (tool_bin / "vllm").chmod(0o755)
    settings = load()
    assert settings.url is not None
    return Agent(settings, Client(settings.url, FLEET_KEY, BOX, deadline_s=0.0, user_agent=USER_AGENT),
                 uniform=lambda low, high: 1.0)


def test_a_server_that_crash_loops_after_the_install_was_reported_is_reported_failed_once(
        supervisor: Supervisor, control_plane: FakeControlPlane, box_json: dict[str, Any], box_env: Path,
        tool_bin: Path, tmp_path: Path, ports: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    """`large` loads past startsecs (1 s) on its first start, so supervisord's verdict is RUNNING and the
    agent reports installed; then it exits 1, and every restart exits 1 at once: supervisord retries
    startretries times and gives up (FATAL). The agent's next polls see it and send one `failed` report
    for that revision, with the server and what supervisord showed, and its report key. Its polls here
    are 0.1 s apart, so they may count three restarts (EXITED, BACKOFF, BACKOFF) before FATAL: the report
    then says it did not stay up, and FATAL later sends no second one."""
    monkeypatch.setenv("FLEETLLM_URL", control_plane.url)
    report_key = "report-key-for-tests-0001"
    control_plane.boxes[BOX] = {**box_json, "revision": "bad-boot-revision", "report_key": report_key}
    marker = tmp_path / "large-started-once"
    agent = agent_with_crashing_server(tool_bin, ports[1], f"if [ -e {marker} ]; then exit 1; fi; : > {marker}; "
                                       "sleep 4; exit 1")
    assert agent.poll().result == "applied"
    installed = control_plane.reports[-1]
    assert installed["outcome"] == "installed"
    assert {s["name"]: s["state"] for s in installed["servers"]} == {"small": "started", "large": "started"}
    assert agent.poll().result == "same"  # large still runs: nothing more to say
    assert len(control_plane.reports) == 1

    def failed() -> list[dict[str, Any]]:
        agent.poll()
        return [r for r in control_plane.reports if r["outcome"] == "failed"]

    reports = wait_until("a failed report", failed, 90)
    wait_until("supervisord gives up", lambda: agent.poll() and supervisor.states()["fleetllm-large"] == "FATAL", 30)
    assert supervisor.states()["fleetllm-small"] == "RUNNING"
    for _ in range(3):  # later polls find it FATAL still: no second report
        agent.poll()
    assert len(control_plane.reports) == 2
    report = reports[0]
    assert report["revision"] == "bad-boot-revision"
    assert {s["name"]: s["state"] for s in report["servers"]} == {"small": "started", "large": "failed"}
    assert ("supervisord gave up on fleetllm-large (FATAL)" in report["message"]
            or "fleetllm-large did not stay up: 3 restarts seen" in report["message"])
    posts = [r for r in control_plane.requests if r["method"] == "POST"]
    assert posts[-1]["headers"].get("x-fleetllm-report-key") == report_key
    for server in box_json["servers"]:
        assert server["api_key"] not in str(report)
    # The control plane takes it (its schema) and the rollout reads it as a failed install of that
    # revision, with `large` crash-looping: failure_of halts on either (tests/reconcile/test_rollout_pass.py).
    facts = report_facts(parse_report(json.dumps(report).encode(), BOX, "127.0.0.1", 1.0))
    assert facts is not None
    assert (facts.revision, facts.install_failed, facts.failed) == ("bad-boot-revision", True, {"large"})


def test_a_server_that_keeps_restarting_but_never_goes_fatal_is_reported_failed_once(
        supervisor: Supervisor, control_plane: FakeControlPlane, box_json: dict[str, Any], box_env: Path,
        tool_bin: Path, ports: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    """`large` lives 2.5 s each time, past startsecs (1 s), then exits 1: RUNNING -> EXITED -> STARTING
    -> RUNNING for ever under autorestart, so supervisord never gives up on it (FATAL is never seen). The
    agent's polls see it restart (EXITED, a new pid) and send one `failed` report saying it did not stay
    up; with the detection off (CRASH_RESTARTS out of reach) nothing would be sent, as before."""
    monkeypatch.setenv("FLEETLLM_URL", control_plane.url)
    control_plane.boxes[BOX] = {**box_json, "revision": "restarting-revision", "report_key": "report-key-for-tests-0002"}
    agent = agent_with_crashing_server(tool_bin, ports[1], "sleep 2.5; exit 1")
    assert agent.poll().result == "applied"
    assert control_plane.reports[-1]["outcome"] == "installed"  # supervisord's verdict: RUNNING past startsecs
    states_seen: set[str] = set()

    def failed() -> list[dict[str, Any]]:
        agent.poll()
        states_seen.add(supervisor.states()["fleetllm-large"])
        return [r for r in control_plane.reports if r["outcome"] == "failed"]

    reports = wait_until("a failed report", failed, 60)
    assert "FATAL" not in states_seen  # supervisord never gave up on it: only the restarts tell
    assert {"RUNNING", "STARTING"} <= states_seen
    wait_until("two more restarts", lambda: failed() and len(agent.watch.seen["large"].restarts) >= 5  # type: ignore[union-attr]
               , 30)
    assert len(control_plane.reports) == 2  # it kept restarting: still the one report
    report = reports[0]
    assert report["revision"] == "restarting-revision"
    assert {s["name"]: s["state"] for s in report["servers"]} == {"small": "started", "large": "failed"}
    assert "fleetllm-large did not stay up: 3 restarts seen in" in report["message"]
    facts = report_facts(parse_report(json.dumps(report).encode(), BOX, "127.0.0.1", 1.0))
    assert facts is not None
    assert (facts.revision, facts.install_failed, facts.failed) == ("restarting-revision", True, {"large"})
