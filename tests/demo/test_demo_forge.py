"""Issue 29's acceptance in the demo: a merge sets `pending` then `success` on the fleet repository's
forge, a bad boot sets `failure` with the reason, and the CI job after each merge (`fleetllm rollout wait
COMMIT`, run by the demo as its own process against the control plane) exits 1 for the bad boot and 0
for the revert. Real processes throughout (the demo's control plane, boxes, agents and reconciler; the
fake GitHub as a process of its own, holding every request and answer to GitHub's published OpenAPI
description and every SHA to the demo's fleet repository); no LiteLLM (the rollouts apply to the demo's
routing table in memory)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from fleetllm.demo.procs import pids_mentioning
from tests.demo.test_demo_real import _clean_env, assert_no_secret, demo_command, free_block, logs
from tests.support.fake_forge import fake_forge

pytestmark = pytest.mark.slow
STARTED = ("pending", "Rolling out: agent-managed boxes move to it in waves")


@pytest.mark.timeout(1200)
def test_a_merge_sets_pending_then_success_and_a_bad_boot_failure_with_the_reason(tmp_path: Path) -> None:
    workdir, first = tmp_path / "demo", free_block()
    with fake_forge(tmp_path / "forge", git_dir=workdir / "fleet") as forge:
        done = subprocess.run(demo_command(workdir, first, "--scenario", "bad-boot", "--once", "--forge-api-url",
                                           forge.url, "--forge-repository", forge.repository, "--forge-token-file",
                                           str(forge.token_file)),
                              env=_clean_env(), capture_output=True, text=True, timeout=1100, check=False)
        out = done.stdout + done.stderr
        assert done.returncode == 0, out
        assert "final state: as expected" in out
        initial, bad, revert = subprocess.run(["git", "-C", str(workdir / "fleet"), "log", "--format=%H", "--reverse"],
                                              capture_output=True, text=True, check=True).stdout.split()
        control_plane = re.search(r"control plane \(fleetllm serve\) on (http://127\.0\.0\.1:\d+)", out)
        assert control_plane is not None, out

        # The first commit and the revert: pending, then success. The bad boot: pending, then failure with
        # the reason (which box, what failed, where it went back to).
        assert forge.states(initial) == [STARTED, ("success", "Converged: every agent-managed box runs it (0 waves)")]
        assert forge.states(revert)[0] == STARTED and forge.states(revert)[-1][0] == "success", forge.states(revert)
        states = forge.states(bad)
        assert [state for state, _ in states] == ["pending", "failure"], states
        failure = states[-1][1]
        assert failure.startswith("Halted: box ") and "crash-loop" in failure and len(failure) <= 140, failure
        assert f"rolled back to {initial[:12]}" in failure or failure.endswith("…"), failure
        newest = forge.statuses(bad)[0]
        assert newest["context"] == "fleetllm/rollout"
        assert newest["target_url"] == f"{control_plane.group(1)}/revision#rollout"
        assert forge.violations() == []
        assert {(r["authorized"], r["user_agent"]) for r in forge.state()["requests"] if r["method"] == "POST"} == {
            (True, "fleetllm-forge")}

    # The CI job after each merge: 1 for the bad boot (halted, rolled back), 0 for the revert.
    assert f"  CI: fleetllm rollout wait {bad[:12]} exited 1: halted: box " in out
    assert f"  CI: fleetllm rollout wait {revert[:12]} exited 0: converged: every agent-managed box runs " \
           f"{revert[:12]}" in out
    waited = (workdir / "control-plane" / f"rollout-wait-{bad[:12]}.log").read_text()
    assert f"rollout of {bad[:12]}: running" in waited  # it printed the progress on the way

    assert pids_mentioning(str(workdir)) == []
    token = (tmp_path / "forge" / "forge-token").read_text()
    assert token not in out and token not in logs(workdir)
    assert_no_secret(workdir, out, logs(workdir))
