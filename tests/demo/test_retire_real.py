"""Issue 25's first acceptance, end to end with the demo's real processes (the control plane, per box a
provisioning script, the installer and a supervisord running the stub vLLM, the box agents, the reconciler;
the real LiteLLM under load when CI provides one, else plan-only): remove a box (or empty it by moving its
servers away), and its deployments leave LiteLLM, its agent is served a box JSON with no servers at its
next poll and removes every program, it reports and is retired; then a recipe change's rollout converges
and the attention list stays clear."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fleetllm.adapters.state import open_store
from fleetllm.core.rollout.model import RolloutState
from fleetllm.core.rollout.retire import RetireState
from fleetllm.demo.fleet import addresses
from fleetllm.demo.procs import pids_mentioning
from tests.demo.test_demo_real import (
    _provisioned_once,
    _rollout_lines,
    assert_no_secret,
    free_block,
    logs,
    none_failed,
    run_scenario,
)
from tests.support.litellm import LitellmProxy, proxy_from_env

pytestmark = pytest.mark.slow


@pytest.mark.timeout(1000)
@pytest.mark.parametrize(("scenario", "leaving"), [("retire-box", 1), ("empty-box", 1)])
def test_a_removed_box_stops_its_servers_and_the_next_rollout_converges(tmp_path: Path, scenario: str,
                                                                        leaving: int) -> None:
    proxy: LitellmProxy | None = proxy_from_env()
    workdir, first = tmp_path / "demo", free_block()
    boxes = addresses(first, 4)
    gone = boxes[leaving]  # the 48 GB box: its two qwen3-8b servers run elsewhere too, and fit elsewhere
    out = run_scenario(workdir, first, scenario, proxy)
    _provisioned_once(workdir, boxes)  # no manual step: the box was told to stop by its agent's poll
    summary = _rollout_lines(out)
    assert f"emptying {gone}" in summary[0] if scenario == "empty-box" else summary[0].startswith(
        f"  remove box {gone}: converged in"), out
    assert "converged in" in summary[0] and "a recipe change: " in summary[1] and "converged in" in summary[1], out
    if proxy is not None:  # under load through the real LiteLLM: not one request failed
        none_failed(out)

    # The box's agent applied a box JSON with no servers at one poll, removed every program (its own
    # included) and reported; it never got a failed fetch (a 404 or 503 would have left its programs).
    agent_log = (workdir / "simulated-boxes" / gone / "data" / "fleetllm" / "logs" / "agent.log").read_text()
    assert f"box {gone} at revision " in agent_log and ": 0 server(s)" in agent_log, agent_log
    removed = re.search(r"wrote 0 program\(s\) in \S+; removed (.*)\"", agent_log)
    assert removed is not None and "fleetllm-agent" in removed.group(1), agent_log
    assert "reported installed to the control plane" in agent_log.split(": 0 server(s)")[1]
    assert "keeps its programs" not in agent_log, agent_log
    assert "agent: stopped" in agent_log

    assert_retired(workdir, gone, set(boxes) - {gone}, out)


def assert_retired(workdir: Path, gone: str, staying: set[str], out: str) -> None:
    """The demo ended with `gone` retired by its empty report, forgotten by the rollout (which converged with the
    `staying` boxes), never an unknown box, no process left, no secret in its output or a log."""
    store = open_store(f"sqlite:///{workdir / 'control-plane' / 'state.sqlite3'}")
    try:
        retirement = store.retirements()[gone]
        releases = store.box_releases()
        rollout, _, _ = store.current_rollout()
        attention = store.attention()
        report = store.latest_report(gone)
    finally:
        store.close()
    assert retirement.state is RetireState.RETIRED and retirement.reason == "it reported that it runs no server"
    assert report is not None and report.runs_nothing() and report.revision == retirement.revision
    assert gone not in releases and set(releases) == staying
    assert rollout is not None and rollout.state is RolloutState.CONVERGED
    assert attention == []  # never an unknown box
    assert pids_mentioning(str(workdir)) == []
    assert_no_secret(workdir, out, logs(workdir))
