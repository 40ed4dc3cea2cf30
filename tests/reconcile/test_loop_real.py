"""The whole loop with real parts: a fleet git repository, `fleetllm plan`/`apply` processes, the real
LiteLLM proxy, and stub vLLM processes (tests/support/stub_vllm.py, the bearer from VLLM_API_KEY) on
loopback addresses (127.0.0.x) behind the static provider. A chat completion sent through LiteLLM
reaches the right server; moving a model moves its deployment; a server that dies is Down and loses
its deployment; restored, it gets it back. (Started directly here; the installer-and-control-plane
version of this loop is test_full_loop_real.py.)"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import aiohttp

from fleetllm.core.fleet.bearer import Salt
from tests.conftest import git
from tests.support.litellm import LitellmProxy
from tests.support.ports import free_ports

from .procs import Stub

SALT = "e2e-salt-0123456789abcdef"
ROOT = Path(__file__).resolve().parents[2]


def write_fleet(repo: Path, ports: list[int], placement: dict[str, list[tuple[str, int]]]) -> None:
    (repo / "fleet.yaml").write_text(
        "version: 1\nfleet_id: test-fleet\n"
        f"listen_ports: [{', '.join(str(p) for p in ports)}]\n"
        "reconcile:\n  health_grace_s: 600\n  probe_timeout_s: 2\n  down_after_failures: 2\n"
        "  up_after_successes: 2\n  max_deletes_per_pass: 10\n  max_delete_fraction: 1.0\n")
    (repo / "models.yaml").write_text(
        "models:\n"
        "  tiny-a:\n    vllm: {model: org/tiny-a, max_model_len: 4096}\n"
        "    litellm: {model_info: {context_window: 4096}}\n"
        "  tiny-b:\n    vllm: {model: org/tiny-b, max_model_len: 4096}\n")
    lines = ["hosts:"]
    for box, rows in placement.items():
        lines.append(f"  {box}:")
        lines.extend(f"    - [{model}, {port}]" for model, port in rows)
    (repo / "placement.yaml").write_text("\n".join(lines) + "\n")


def commit(repo: Path, message: str) -> None:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)


class Cli:
    def __init__(self, config: Path, env: dict[str, str]) -> None:
        self.config, self.env = config, env

    async def __call__(self, *args: str) -> tuple[int, str]:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "fleetllm", *args, "--config", str(self.config), env=self.env, cwd=ROOT,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        out, _ = await asyncio.wait_for(process.communicate(), timeout=120)
        return process.returncode or 0, out.decode()


async def chat(proxy: LitellmProxy, model: str) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.post(
            proxy.url.rstrip("/") + "/v1/chat/completions",
            headers={"Authorization": f"Bearer {proxy.master_key}"},
            json={"model": model, "messages": [{"role": "user", "content": "hi"}]}) as response:
        return response.status, await response.json(content_type=None)


def managed(proxy: LitellmProxy) -> dict[str, str]:
    return {r["model_info"]["id"]: r["model_name"] for r in proxy.deployments()
            if r["model_info"].get("managed_by") == "fleetllm"}


def test_whole_loop_against_real_litellm(litellm: LitellmProxy, tmp_path: Path) -> None:
    asyncio.run(scenario(litellm, tmp_path))


async def scenario(proxy: LitellmProxy, tmp: Path) -> None:
    p1, p2, p3 = free_ports("127.0.0.2", "127.0.0.3", "127.0.0.3")
    ports = [p1, p2, p3]
    repo = tmp / "fleet"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    write_fleet(repo, ports, {"127.0.0.2": [("tiny-a", p1)], "127.0.0.3": [("tiny-b", p2)]})
    commit(repo, "two boxes")
    config = tmp / "control-plane.yaml"
    config.write_text(
        f"litellm: {{url: '{proxy.url}', master_key: '${{env:E2E_LITELLM_KEY}}', write_concurrency: 4}}\n"
        "secrets: {vllm_api_salt: '${env:E2E_SALT}'}\n"
        f"repo: {{path: '{repo}', branch: main}}\n"
        f"state: {{url: 'sqlite:///{tmp}/state.db'}}\n")
    env = {**os.environ, "E2E_LITELLM_KEY": proxy.master_key, "E2E_SALT": SALT}
    cli = Cli(config, env)
    salt = Salt(SALT)
    ida1, idb2, ida3 = f"fleetllm:127.0.0.2:{p1}", f"fleetllm:127.0.0.3:{p2}", f"fleetllm:127.0.0.3:{p3}"
    stubs = [Stub("127.0.0.2", p1, "org/tiny-a", "tiny-a", salt.derive("127.0.0.2", p1)),
             Stub("127.0.0.3", p2, "org/tiny-b", "tiny-b", salt.derive("127.0.0.3", p2))]
    try:
        await story(proxy, tmp, repo, ports, cli, salt, stubs, (ida1, idb2, ida3))
    finally:
        for stub in stubs:
            stub.kill()


async def story(proxy: LitellmProxy, tmp: Path, repo: Path, ports: list[int], cli: Cli, salt: Salt,
                stubs: list[Stub], ids: tuple[str, str, str]) -> None:
    p1, p2, p3 = ports
    ida1, idb2, ida3 = ids
    code, out = await cli("plan", "--detailed-exitcode")
    assert code == 2, out
    assert f"+ deployment {ida1}  tiny-a  will be created" in out
    assert "Plan: 2 to add, 0 to change, 0 to destroy." in out
    assert salt.derive("127.0.0.2", p1) not in out

    dry = tmp / "dry-run.yaml"
    dry.write_text(cli.config.read_text() + "reconcile: {dry_run: true}\n")
    metrics = tmp / "dry-run.prom"
    code, out = await Cli(dry, cli.env)("reconcile", "--once", "--metrics-file", str(metrics))
    assert "reconcile_dry_run" in out
    assert "Plan: 2 to add" in out
    assert managed(proxy) == {}  # a dry run writes nothing
    assert 'fleetllm_reconcile_actions_total{kind="create",result="planned"} 2.0' in metrics.read_text()
    assert "fleetllm_litellm_up 1.0" in metrics.read_text()  # the pass listed the real proxy's deployments
    assert 'fleetllm_model_intended_servers{model="tiny-a"}' in metrics.read_text()

    saved = tmp / "first.plan.json"
    code, out = await cli("plan", "--out", str(saved))
    assert code == 0, out
    assert salt.derive("127.0.0.2", p1) not in saved.read_text()
    code, out = await cli("apply", str(saved))  # applies exactly the saved plan
    assert code == 0, out
    assert managed(proxy) == {ida1: "tiny-a", idb2: "tiny-b"}
    code, out = await cli("plan", "--detailed-exitcode")
    assert code == 0, out
    assert "No changes." in out

    status, body = await chat(proxy, "tiny-a")
    assert status == 200, body
    assert body["choices"][0]["message"]["content"].startswith(f"stub-vllm tiny-a port {p1}:")

    # Move tiny-a to 127.0.0.3:p3 in a new commit; its new server comes up there. A plan saved
    # before the commit is stale now: applying it writes nothing.
    code, out = await cli("plan", "--out", str(saved))
    assert code == 0, out
    write_fleet(repo, ports, {"127.0.0.3": [("tiny-b", p2), ("tiny-a", p3)]})
    commit(repo, "move tiny-a")
    code, out = await cli("apply", str(saved))
    assert code == 1, out
    assert "run fleetllm plan again" in out
    assert managed(proxy) == {ida1: "tiny-a", idb2: "tiny-b"}
    stubs.append(Stub("127.0.0.3", p3, "org/tiny-a", "tiny-a", salt.derive("127.0.0.3", p3)))
    code, out = await cli("apply", "--yes")
    assert code == 0, out
    assert out.index(f"+ deployment {ida3}") < out.index(f"- deployment {ida1}")
    assert managed(proxy) == {ida3: "tiny-a", idb2: "tiny-b"}
    status, body = await chat(proxy, "tiny-a")
    assert status == 200, body
    assert body["choices"][0]["message"]["content"].startswith(f"stub-vllm tiny-a port {p3}:")

    # Kill tiny-b's server: one failed probe keeps it (hysteresis), the second makes it Down.
    stubs[1].kill()
    code, out = await cli("apply", "--yes")
    assert code == 0, out
    assert idb2 in managed(proxy)
    assert "1 failed probe(s) in a row" in out
    code, out = await cli("apply", "--yes")
    assert code == 0, out
    assert f"- deployment {idb2}" in out
    assert "Down:" in out
    assert managed(proxy) == {ida3: "tiny-a"}

    # Restore it: Down recovers only after two good probes in a row.
    stubs[1] = Stub("127.0.0.3", p2, "org/tiny-b", "tiny-b", salt.derive("127.0.0.3", p2))
    code, out = await cli("apply", "--yes")
    assert code == 0, out
    assert "recovering: 1 of 2" in out
    assert idb2 not in managed(proxy)
    code, out = await cli("apply", "--yes")
    assert code == 0, out
    assert managed(proxy) == {ida3: "tiny-a", idb2: "tiny-b"}
    status, body = await chat(proxy, "tiny-b")
    assert status == 200, body
    assert body["choices"][0]["message"]["content"].startswith(f"stub-vllm tiny-b port {p2}:")
    code, out = await cli("plan", "--detailed-exitcode", "--format", "json")
    assert code == 0, out
