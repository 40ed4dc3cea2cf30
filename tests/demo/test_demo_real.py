"""`llmfleet demo` end to end, as a user runs it: real processes throughout (the control plane, per box
a provisioning script, the installer fetched from the control plane and a supervisord running the stub
vLLM, the reconciler; the real LiteLLM proxy when CI provides one, else plan-only). Each run simulates
its boxes on loopback addresses no other test uses, and must leave no process behind."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from llmfleet.adapters.state import open_store
from llmfleet.demo.fleet import addresses
from llmfleet.demo.procs import can_bind, pids_mentioning
from tests.support.integration import REQUIRE_ENV, missing, required
from tests.support.litellm import SKIP_REASON, LitellmProxy, proxy_from_env

LLMFLEET = Path(sys.executable).parent / "llmfleet"
SECRETS = ("fleet-key", "vllm-api-salt", "legacy-api-key", "admin-token", "litellm-master-key")
pytestmark = pytest.mark.slow


def free_block() -> str:
    """A first address whose four boxes have their listen ports free (concurrent runs pick others)."""
    rng = random.Random()
    for _ in range(100):
        first = f"127.{rng.randint(100, 250)}.{rng.randint(0, 250)}.2"
        if all(can_bind(a, p) for a in addresses(first, 4) for p in (8000, 8001, 8002, 8003)):
            return first
    missing("no free loopback block for the simulated boxes")
    raise AssertionError("missing() does not return")


def demo_command(workdir: Path, first: str, *extra: str) -> list[str]:
    return [str(LLMFLEET), "demo", "--workdir", str(workdir), "--first-address", first, "--timeout", "240", *extra]


def logs(workdir: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in workdir.rglob("*.log") if p.is_file())


def assert_no_secret(workdir: Path, *texts: str) -> None:
    for name in SECRETS:
        value = (workdir / "secrets" / name).read_text()
        for text in texts:
            assert value not in text, f"the {name} appears in the output or a log"


def test_move_model_once(tmp_path: Path) -> None:
    workdir, first = tmp_path / "demo", free_block()
    boxes = addresses(first, 4)
    source, target = boxes[0], boxes[1]
    proxy: LitellmProxy | None = proxy_from_env()
    if proxy is None and required():  # CI runs the demo against the real proxy, never plan-only by accident
        pytest.fail(f"{REQUIRE_ENV}=1: {SKIP_REASON}", pytrace=False)
    env = {k: v for k, v in os.environ.items() if k not in ("LITELLM_MASTER_KEY", "LLMFLEET_DEMO_LITELLM")}
    extra: list[str] = []
    if proxy is not None:
        proxy.reset()
        env["LITELLM_MASTER_KEY"] = proxy.master_key
        extra = ["--litellm-url", proxy.url]
    done = subprocess.run(demo_command(workdir, first, "--scenario", "move-model", "--once", *extra), env=env,
                          capture_output=True, text=True, timeout=1200, check=False)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "final state: as expected" in out

    # The scenario committed the move, showed `llmfleet diff`, and both boxes re-ran their installer.
    placement = (workdir / "fleet" / "placement.yaml").read_text()
    assert placement.index(f"{target}:") < placement.index("[qwen2.5-coder-7b, 8003]")
    assert f"qwen2.5-coder-7b moves to {target}:8003" in out
    for box in (source, target):
        provisioned = (workdir / "simulated-boxes" / box / "provision.log").read_text()
        assert provisioned.count(f'"event":"provisioning","box":"{box}"') == 2
        assert provisioned.count('"logger":"llmfleet.provision","event":"installer sha256 ') == 2
    assert f"{target}:8003 qwen2.5-coder-7b: new -> Loading" in out
    assert f"{target}:8003 qwen2.5-coder-7b: Loading -> Healthy" in out
    # The runpod-template box booted through runpod.sh, which became its supervisord.
    assert "handed to supervisord (none)" in (workdir / "simulated-boxes" / boxes[2] / "provision.log").read_text()
    if proxy is not None:
        assert out.index(f"LiteLLM create llmfleet:{target}:8003") < out.index(f"LiteLLM delete llmfleet:{source}:8003")
        assert "chat completion through LiteLLM to qwen2.5-coder-7b: 'stub-vllm qwen2.5-coder-7b port 8003: hello'" in out
        assert not [r for r in proxy.deployments() if r["model_info"].get("managed_by") == "llmfleet"]
    else:
        assert "Plan: 7 to add, 0 to change, 0 to destroy.  (plan only: nothing is written)" in out

    # Every pass is recorded in the control plane's state (what the status page shows), plan-only too.
    store = open_store(f"sqlite:///{workdir / 'control-plane' / 'state.sqlite3'}")
    try:
        last = store.recent_passes(1)[0]
    finally:
        store.close()
    assert last.mode == ("apply" if proxy is not None else "plan")
    assert last.verdicts == {"Healthy": 7}

    assert pids_mentioning(str(workdir)) == []
    assert_no_secret(workdir, out, logs(workdir))


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_stops_every_process(tmp_path: Path, stop: signal.Signals) -> None:
    workdir, first = tmp_path / "demo", free_block()
    output = tmp_path / "demo.out"
    env = {k: v for k, v in os.environ.items() if k not in ("LITELLM_MASTER_KEY", "LLMFLEET_DEMO_LITELLM")}
    with open(output, "wb") as out:
        process = subprocess.Popen(demo_command(workdir, first), env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while "Healthy" not in output.read_text() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert process.poll() is None, output.read_text()
        assert pids_mentioning(str(workdir)), "the demo's processes should be running"
        process.send_signal(stop)
        assert process.wait(timeout=180) == 0, output.read_text()
    finally:
        if process.poll() is None:
            process.kill()
    text = output.read_text()
    assert "stopping the demo (Ctrl-C or a stop signal)" in text
    assert pids_mentioning(str(workdir)) == []
    assert "outlived their shutdown" not in text
