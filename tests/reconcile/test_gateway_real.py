"""Servers behind a box gateway, with real processes: two stub vLLMs on loopback behind the real box
gateway (`fleetllm gateway`). The probe goes through the gateway's path routing with the gateway's
bearer, so it sees each vLLM behind it; and with the real LiteLLM a pass creates one deployment per
server, all pointing at the gateway, and a chat reaches the right stub through it."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from fleetllm.adapters.litellm import LitellmClient
from fleetllm.adapters.probe import in_flight, probe, read_in_flight
from fleetllm.adapters.state.reconcile import MemoryStore
from fleetllm.core.fleet.bearer import Salt
from fleetllm.core.fleet.model import (
    Box,
    Fleet,
    FleetSettings,
    Recipe,
    ReconcileSettings,
    ServerRow,
    VllmRecipe,
    frozen_map,
)
from fleetllm.core.fleet.render import Bearers
from fleetllm.core.judge.intended import Endpoint
from fleetllm.core.judge.observed import ProbeStatus
from fleetllm.core.secret import Secret
from fleetllm.job.engine import Reconciler
from fleetllm.job.observer import Observer
from tests.support.litellm import LitellmProxy
from tests.support.ports import free_ports

from .procs import Stub

ROOT = Path(__file__).resolve().parents[2]
FLEETLLM = Path(sys.executable).parent / "fleetllm"
SALT = Salt("gateway-salt-0123456789abcdef")
BOX = "127.0.0.1"


class GatewayBox:
    def __init__(self, tmp: Path) -> None:
        tiny_a, tiny_b, self.gateway_port = free_ports("127.0.0.1", "127.0.0.1", "127.0.0.1")
        self.ports = {"tiny-a": tiny_a, "tiny-b": tiny_b}
        self.bearer = SALT.derive(BOX, self.gateway_port)
        self.stubs = {m: Stub(BOX, p, f"org/{m}", m, SALT.derive(BOX, p)) for m, p in self.ports.items()}
        config = {"host": BOX, "port": self.gateway_port, "authTokens": ["${env:GW_CLIENT_TOKEN}"],
                  "models": {m: {"url": f"http://{BOX}:{p}",
                                 "headers": {"Authorization": f"Bearer ${{env:GW_BEARER_{i}}}"}}
                             for i, (m, p) in enumerate(self.ports.items())}}
        path = tmp / "gateway.json"
        path.write_text(json.dumps(config))
        env = {**os.environ, "GW_CLIENT_TOKEN": self.bearer,
               **{f"GW_BEARER_{i}": SALT.derive(BOX, p) for i, p in enumerate(self.ports.values())}}
        self.process = subprocess.Popen([str(FLEETLLM), "gateway", "--config", str(path)], env=env, cwd=tmp,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://{BOX}:{self.gateway_port}/health", timeout=1):
                    return
            except OSError:
                time.sleep(0.1)
        self.close()
        raise AssertionError("the box gateway did not come up")

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)
        for stub in self.stubs.values():
            stub.kill()

    def fleet(self) -> Fleet:
        recipes = {m: Recipe(m, VllmRecipe(model=f"org/{m}", served_model_name=m, max_model_len=4096))
                   for m in self.ports}
        rows = tuple(ServerRow(m, p, m) for m, p in self.ports.items())
        settings = FleetSettings(listen_ports=(self.gateway_port,), fleet_id="test-fleet", reconcile=ReconcileSettings(
            probe_timeout_s=5, max_delete_fraction=1.0))
        return Fleet("g" * 40, settings, frozen_map(recipes),
                     frozen_map({BOX: Box(BOX, rows, gateway_port=self.gateway_port)}))


@pytest.fixture
def gateway_box(tmp_path: Path) -> Iterator[GatewayBox]:
    box = GatewayBox(tmp_path)
    try:
        yield box
    finally:
        box.close()


def test_probes_go_through_the_gateway_to_each_server(gateway_box: GatewayBox) -> None:
    endpoint = Endpoint(BOX, gateway_box.gateway_port)

    async def go() -> dict[str, ProbeStatus]:
        async with aiohttp.ClientSession() as session:
            async def status(name: str, bearer: str = gateway_box.bearer) -> ProbeStatus:
                return (await probe(session, endpoint, bearer, name, 5, via_gateway=True)).status
            healthy = await probe(session, endpoint, gateway_box.bearer, "tiny-a", 5, via_gateway=True)
            assert healthy.gateway_models == 2  # the gateway's own /health count rides along
            found = {"a": await status("tiny-a"), "wrong bearer": await status("tiny-a", "sk-vllm-nope"),
                     "not routed": await status("tiny-c")}
            gateway_box.stubs["tiny-b"].kill()
            found["b down"] = await status("tiny-b")
            return found

    assert asyncio.run(go()) == {"a": ProbeStatus.OK, "wrong bearer": ProbeStatus.UNAUTHORIZED,
                                 "not routed": ProbeStatus.UNHEALTHY, "b down": ProbeStatus.REFUSED}


def test_the_gateway_reports_each_model_s_requests_in_flight_for_a_drain_without_litellm(
        gateway_box: GatewayBox) -> None:
    endpoint = Endpoint(BOX, gateway_box.gateway_port)

    async def go() -> list[int | None]:
        async with aiohttp.ClientSession() as session:
            return [await in_flight(session, endpoint, gateway_box.bearer, "tiny-a", 5, via_gateway=True),
                    await in_flight(session, endpoint, gateway_box.bearer, "tiny-c", 5, via_gateway=True),
                    await in_flight(session, endpoint, "sk-vllm-nope", "tiny-a", 5, via_gateway=True),
                    # a server no gateway fronts: vLLM's own /metrics (the simulated vLLM's, here)
                    await in_flight(session, Endpoint(BOX, gateway_box.ports["tiny-b"]),
                                    SALT.derive(BOX, gateway_box.ports["tiny-b"]), "tiny-b", 5)]

    # idle: 0 (known); a model the gateway does not route, or a bearer it refuses: unknown
    assert asyncio.run(go()) == [0, None, None, 0]


def test_requests_in_flight_are_read_from_the_gateway_s_or_vllm_s_metrics() -> None:
    gateway = ('# TYPE fleetllm_gateway_requests_in_flight gauge\n'
               'fleetllm_gateway_requests_in_flight{model="a"} 2\nfleetllm_gateway_requests_in_flight{model="ab"} 7\n'
               'fleetllm_gateway_requests_queued{model="a"} 1\nfleetllm_gateway_concurrency_limit{model="a"} 9\n')
    assert read_in_flight(gateway, "a", via_gateway=True) == 3
    assert read_in_flight(gateway, "b", via_gateway=True) is None
    vllm = ('vllm:num_requests_running{engine="0",model_name="m"} 4.0\n'
            'vllm:num_requests_waiting{engine="0",model_name="m"} 1.0\n')
    assert read_in_flight(vllm, "m", via_gateway=False) == 5
    assert read_in_flight(vllm, "m", via_gateway=True) is None  # not the gateway's names


def test_deployments_point_at_the_gateway_and_chat_goes_through_it(gateway_box: GatewayBox,
                                                                  litellm: LitellmProxy) -> None:
    reconciler = Reconciler(Bearers(SALT), Observer({}, 5, 8),
                            lambda s: LitellmClient(s, litellm.url, Secret(litellm.master_key, "test")), MemoryStore())
    outcome = asyncio.run(reconciler.run_pass(gateway_box.fleet(), apply=True))
    assert sorted(r.outcome for r in outcome.results) == ["created", "created"]
    rows = {r["model_info"]["id"]: r for r in litellm.deployments() if r["model_info"].get("managed_by")}
    assert set(rows) == {f"fleetllm:{BOX}:{p}" for p in gateway_box.ports.values()}
    for row in rows.values():
        assert row["litellm_params"]["api_base"] == f"http://{BOX}:{gateway_box.gateway_port}/v1"
        assert row["model_info"]["fleetllm_gateway_port"] == gateway_box.gateway_port
    for model, port in gateway_box.ports.items():
        request = urllib.request.Request(litellm.url.rstrip("/") + "/v1/chat/completions", method="POST",
                                         data=json.dumps({"model": model, "messages": [
                                             {"role": "user", "content": "hi"}]}).encode(),
                                         headers={"Authorization": f"Bearer {litellm.master_key}",
                                                  "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            text = json.loads(response.read())["choices"][0]["message"]["content"]
        assert text.startswith(f"stub-vllm {model} port {port}:")
    again = asyncio.run(reconciler.run_pass(gateway_box.fleet(), apply=True))
    assert again.plan.empty
