"""Issue 25's rent-box acceptance, end to end with the demo's real processes (the control plane, the shipped
reconcile passes, per box a provisioning script, the installer and a supervisord running the stub vLLM, the box
agents) and the simulated RunPod (fleetllm.demo.runpod) the passes rent from; under load through the real
LiteLLM when CI provides one, else with the demo's in-memory routing table: one commit declares a capacity pool
and places its box by label; the pass rents a pod, which boots under its label (runpod.sh, the installer) and is
approved by that commit (never an unknown box), serves (routed by LiteLLM); then one commit releases it (out of
the placement, its pool's count 0), it is drained, retires and is terminated, its box stopped."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from fleetllm.demo.fleet import addresses
from tests.demo.test_demo_real import _provisioned_once, _rollout_lines, free_block, logs, none_failed, run_scenario
from tests.demo.test_retire_real import assert_retired
from tests.support.litellm import LitellmProxy, proxy_from_env

pytestmark = pytest.mark.slow
LABEL = "fleetllm-demo-1"


@pytest.mark.timeout(1000)
def test_a_box_declared_in_git_is_rented_serves_and_is_terminated(tmp_path: Path) -> None:
    proxy: LitellmProxy | None = proxy_from_env()
    workdir, first = tmp_path / "demo", free_block()
    boxes = addresses(first, 4)
    out = run_scenario(workdir, first, "rent-box", proxy)
    summary = _rollout_lines(out)
    assert summary[0].startswith("  declare capacity: pool demo, ") and "converged in" in summary[0], out
    assert summary[1].startswith(f"  release the rented box {LABEL}: ") and "converged in" in summary[1], out
    if proxy is not None:  # under load through the real LiteLLM: not one request failed, in either commit
        tallies = none_failed(out)
        assert len({model for model, _ in tallies}) >= 4 and len(tallies) >= 8, out
        assert f"LiteLLM create fleetllm:{LABEL}:8001" in out and f"LiteLLM delete fleetllm:{LABEL}:8001" in out
        served = (workdir / "simulated-boxes" / LABEL / "data" / "fleetllm" / "logs" / "qwen3-8b.log").read_text()
        assert '"POST /v1/chat/completions" 200' in served  # LiteLLM routed callers to the rented box

    # Rented by the shipped pass from the simulated RunPod, and terminated by it, each once.
    reconciled = (workdir / "control-plane" / "reconcile.log").read_text()
    done = [json.loads(line) for line in reconciled.splitlines() if '"capacity_done"' in line]
    assert [d["what"].split(" ")[0] for d in done] == ["rent", "terminate"], done
    pod = re.search(r"runpod id (\S+), box " + LABEL, done[0]["detail"])
    assert pod is not None, done
    assert done[1]["what"] == f"terminate runpod {pod.group(1)} ({pod.group(1)})"
    # Booted once, by runpod.sh and the installer, as its label (no restart, no approval step); the agent then
    # emptied it at one poll and reported.
    _provisioned_once(workdir, [*boxes, LABEL])
    provisioned = (workdir / "simulated-boxes" / LABEL / "provision.log").read_text()
    assert f"running the installer for {LABEL}" in provisioned and "handed to supervisord" in provisioned
    agent_log = (workdir / "simulated-boxes" / LABEL / "data" / "fleetllm" / "logs" / "agent.log").read_text()
    assert f"box {LABEL} at revision " in agent_log and ": 0 server(s)" in agent_log, agent_log

    assert_retired(workdir, LABEL, set(boxes), out)  # approved by the commit that declared it: never unknown
    runpod_key = (workdir / "secrets" / "runpod-api-key").read_text()
    assert runpod_key not in out and runpod_key not in logs(workdir)
