"""Moving a running llmao fleet to fleetllm with real parts and no request lost.

llmao's files (every row form, a legacy pair, a 12-character salt) are imported with `fleetllm import
llmao`; stub vLLM processes on loopback addresses run with the bearers llmao gave them; the real LiteLLM
proxy holds the deployments exactly as llmao writes them (`/model/new`, LiteLLM's ids, api_base
`http://HOST:PUBLIC_PORT/v1`, the derived bearer, `model_info.self_hosted` and `asf_api_base`) plus one
commercial entry. While a load generator sends chat completions through LiteLLM to every model,
`fleetllm apply --adopt llmao` runs: it ends with exactly one fleetllm deployment per serving server, no
llmao deployment left for them, the commercial entry untouched, and not one failed request."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import os
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.support.litellm import LitellmProxy
from tests.support.ports import free_ports

from .procs import ROOT, Stub

pytestmark = pytest.mark.slow

SALT = "salt12chars!"  # 12 characters, as a running llmao fleet may have
LEGACY_KEY = "sk-shared-legacy-key-adopt"
BOX_A, BOX_B = "127.0.0.2", "127.0.0.3"


def contract_bearer(host: str, port: int) -> str:
    """llmao's derivation, from the box contract's text."""
    message = f"llmao.vllm.api_key\n{host}\n{port}".encode()
    digest = hmac.new(SALT.encode(), message, hashlib.sha256).digest()
    return "sk-vllm-" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def llmao_files(tmp: Path, rows: dict[str, list[list[Any]]], legacy_port: int) -> tuple[Path, Path]:
    hosts = "\n".join(f"    {box}:\n" + "\n".join(f"      - {row!r}".replace("'", "").replace("None", "null")
                                                   for row in box_rows) for box, box_rows in rows.items())
    config = tmp / "llmao-config.yaml"
    config.write_text(
        "fleet:\n"
        "  key: fleet-key-adopt-test-0001\n"
        f"  vllm_api_salt: '{SALT}'\n"
        f"  selfhost_api_key: {LEGACY_KEY}\n"
        f"  hosts:\n{hosts}\n"
        "  health_interval_s: 45\n  health_timeout_s: 2\n  health_grace_s: 600\n  health_fail_threshold: 3\n"
        "  skew_interval_s: 180\n")
    models = tmp / "llmao-models.yaml"
    models.write_text(
        "models:\n"
        "  - model_name: tiny-a\n"
        "    litellm_params: {model: hosted_vllm/tiny-a}\n"
        "    model_info:\n"
        "      vllm: {model: org/tiny-a, max_model_len: 4096, vram_gb: 1, disk_gb: 1}\n"
        "      self_hosted: true\n      context_window: 4096\n"
        "  - model_name: tiny-b\n"
        "    litellm_params: {model: hosted_vllm/tiny-b}\n"
        "    model_info:\n"
        "      vllm: {model: org/tiny-b, max_model_len: 4096, args: [--served-model-name, tiny-b]}\n"
        "      self_hosted: true\n"
        "  - model_name: gpt-commercial\n"
        "    litellm_params: {model: openai/gpt-4o, api_base: 'https://api.openai.com/v1'}\n"
        "    model_info: {self_hosted: false}\n")
    return config, models


def llmao_deployment(model: str, host: str, public_port: int, bearer: str) -> dict[str, Any]:
    """What llmao posts to /model/new when a server becomes healthy (reference-system.md section 4)."""
    return {"model_name": model,
            "litellm_params": {"model": f"hosted_vllm/{model}", "api_base": f"http://{host}:{public_port}/v1",
                               "api_key": bearer},
            "model_info": {"self_hosted": True, "asf_api_base": f"http://{host}:{public_port}",
                           "input_cost_per_token": 3.85e-08, "output_cost_per_token": 6.456e-07,
                           "cost_basis": "derived_capacity"}}


class Load:
    """Chat completions through LiteLLM, to every model, a few in flight at a time, until stopped."""

    def __init__(self, proxy: LitellmProxy, models: list[str], concurrency: int = 4) -> None:
        self.proxy, self.models, self.concurrency = proxy, models, concurrency
        self.ok = 0
        self.failed: list[str] = []
        self.by_model: dict[str, int] = dict.fromkeys(models, 0)
        self.stopping = asyncio.Event()

    async def worker(self, session: aiohttp.ClientSession, index: int) -> None:
        n = index
        while not self.stopping.is_set():
            model = self.models[n % len(self.models)]
            n += 1
            try:
                async with session.post(self.proxy.url.rstrip("/") + "/v1/chat/completions",
                                        headers={"Authorization": f"Bearer {self.proxy.master_key}"},
                                        json={"model": model, "messages": [{"role": "user", "content": "hi"}]},
                                        timeout=aiohttp.ClientTimeout(total=60)) as response:
                    body = await response.json(content_type=None)
                    text = body["choices"][0]["message"]["content"] if response.status == 200 else ""
                    if response.status == 200 and text.startswith(f"stub-vllm {model} "):
                        self.ok += 1
                        self.by_model[model] += 1
                    else:
                        self.failed.append(f"{model}: HTTP {response.status} {str(body)[:200]}")
            except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError) as exc:
                self.failed.append(f"{model}: {type(exc).__name__}: {exc}")

    async def run(self) -> None:
        async with aiohttp.ClientSession() as session:
            await asyncio.gather(*(self.worker(session, i) for i in range(self.concurrency)))


async def fleetllm(*args: str, env: dict[str, str]) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "fleetllm", *args, env=env, cwd=ROOT,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(process.communicate(), timeout=180)
    return process.returncode or 0, out.decode()


def test_adopt_llmao_under_load_loses_no_request(litellm: LitellmProxy, tmp_path: Path) -> None:
    p1, p2, p3, p4 = free_ports(BOX_A, BOX_A, BOX_B, BOX_B)
    rows = {BOX_A: [["tiny-a", p1], ["tiny-b", p2, "tiny-b-x"]],
            BOX_B: [["tiny-a", p3, None, p3],  # the older form: name null, public port written by hand
                    ["tiny-b", p4]]}  # a legacy pair: the shared key
    servers = {(BOX_A, p1): "tiny-a", (BOX_A, p2): "tiny-b", (BOX_B, p3): "tiny-a", (BOX_B, p4): "tiny-b"}
    bearers = {key: LEGACY_KEY if key == (BOX_B, p4) else contract_bearer(*key) for key in servers}
    config, models = llmao_files(tmp_path, rows, p4)
    repo = tmp_path / "fleet"
    env = {**os.environ, "FLEETLLM_FLEET_KEY": "fleet-key-adopt-test-0001", "FLEETLLM_VLLM_API_SALT": SALT,
           "FLEETLLM_LEGACY_API_KEY": LEGACY_KEY, "LITELLM_MASTER_KEY": litellm.master_key}
    seeded: list[str] = []
    stubs: list[Stub] = []
    try:
        stubs = [Stub(host, port, f"org/{model}", model, bearers[(host, port)])
                 for (host, port), model in servers.items()]
        for (host, port), model in servers.items():
            status, body = litellm.call("POST", "/model/new", llmao_deployment(model, host, port, bearers[(host, port)]))
            assert status == 200, body
            seeded.append(body["model_id"])
        status, body = litellm.call("POST", "/model/new", {
            "model_name": "gpt-commercial",
            "litellm_params": {"model": "openai/gpt-4o", "api_base": "https://api.openai.com/v1",
                               "api_key": "sk-commercial-not-real"},
            "model_info": {"self_hosted": False}})
        assert status == 200, body
        commercial = body["model_id"]
        seeded.append(commercial)
        asyncio.run(scenario(litellm, tmp_path, config, models, repo, env, servers, seeded, commercial, p4))
    finally:
        for ident in seeded:
            litellm.call("POST", "/model/delete", {"id": ident})
        for stub in stubs:
            stub.kill()


async def scenario(proxy: LitellmProxy, tmp: Path, config: Path, models: Path, repo: Path, env: dict[str, str],
                   servers: dict[tuple[str, int], str], seeded: list[str], commercial: str, legacy_port: int) -> None:
    code, out = await fleetllm("import", "llmao", "--config", str(config), "--models", str(models), "--out", str(repo),
                               "--legacy", f"{BOX_B}:{legacy_port}", "--litellm-url", proxy.url, "--check", env=env)
    assert code == 0, out
    assert "4 of 4 servers have the same bearer as llmao" in out
    cp = str(repo / "control-plane.yaml")

    code, out = await fleetllm("plan", "--config", cp, "--adopt", "llmao", "--detailed-exitcode", env=env)
    assert code == 2, out
    assert "Plan: 4 to add, 0 to change, 4 to destroy." in out, out
    assert out.count("replaced: llmao deployment of") == 4, out
    assert f"{commercial}  gpt-commercial  commercial: not self-hosted" in out
    assert SALT not in out and LEGACY_KEY not in out

    load = Load(proxy, ["tiny-a", "tiny-b"])
    runner = asyncio.create_task(load.run())
    await asyncio.sleep(2)  # traffic flowing through llmao's deployments first
    before = load.ok
    started = time.monotonic()
    code, out = await fleetllm("apply", "--yes", "--config", cp, "--adopt", "llmao", env=env)
    took = time.monotonic() - started
    await asyncio.sleep(3)  # and through fleetllm's afterwards
    load.stopping.set()
    await runner
    assert code == 0, out
    assert before > 0 and load.ok > before
    assert not load.failed, load.failed[:5]
    assert all(n > 0 for n in load.by_model.values()), load.by_model
    print(f"adopt under load: {load.ok} requests ok, {len(load.failed)} failed, apply took {took:.1f}s; "
          f"per model {load.by_model}")

    rows = proxy.deployments()
    managed = sorted(r["model_info"]["id"] for r in rows if r["model_info"].get("managed_by") == "fleetllm")
    assert managed == sorted(f"fleetllm:{box}:{port}" for box, port in servers)
    llmao_left = [r["model_info"]["id"] for r in rows
                  if r["model_info"].get("self_hosted") is True and r["model_info"].get("managed_by") != "fleetllm"]
    assert llmao_left == []
    kept = [r for r in rows if r["model_info"]["id"] == commercial]
    assert len(kept) == 1 and kept[0]["model_name"] == "gpt-commercial"
    assert kept[0]["model_info"].get("self_hosted") is False

    code, out = await fleetllm("plan", "--config", cp, "--adopt", "llmao", "--detailed-exitcode", env=env)
    assert code == 0, out  # converged: nothing left to adopt
