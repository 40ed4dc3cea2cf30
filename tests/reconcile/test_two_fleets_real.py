"""Two fleets sharing one real LiteLLM proxy (issue 27), each moving its model to another box while a
load generator sends chat completions through LiteLLM to both models: not one request fails, and
neither fleet writes (let alone deletes) a deployment of the other. Fleet blue also holds a deployment
written before fleet ids (the marker, no id): its first pass adopts it into its id in place, by one
update, with no delete and no restart; green, which ran first, left it alone.

Only this test's own deployments are cleaned up (the proxy may be shared with other suites)."""

from __future__ import annotations

import asyncio
import secrets
from dataclasses import dataclass, field

import aiohttp
import pytest

from fleetllm.adapters.litellm import LitellmApi, LitellmClient
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
from fleetllm.core.judge.intended import INFO_FLEET, DeploymentSpec, Endpoint, desired_deployment, intended_state
from fleetllm.core.judge.observed import Deployment
from fleetllm.core.secret import Secret
from fleetllm.job.engine import Reconciler
from fleetllm.job.observer import Observer
from tests.support.integration import missing
from tests.support.litellm import SKIP_REASON, LitellmProxy, proxy_from_env
from tests.support.ports import free_ports

from .procs import Stub
from .test_adopt_real import Load

pytestmark = [pytest.mark.slow, pytest.mark.integration]

SALT = Salt("two-fleets-salt-0123456789")


@dataclass
class Recording:
    """A LitellmApi that records every write a fleet's passes make (op, deployment id)."""

    inner: LitellmApi
    writes: list[tuple[str, str]] = field(default_factory=list)

    async def list_deployments(self) -> tuple[Deployment, ...]:
        return await self.inner.list_deployments()

    async def get(self, deployment_id: str) -> Deployment | None:
        return await self.inner.get(deployment_id)

    async def create(self, spec: DeploymentSpec) -> None:
        self.writes.append(("create", spec.id))
        await self.inner.create(spec)

    async def update(self, spec: DeploymentSpec) -> None:
        self.writes.append(("update", spec.id))
        await self.inner.update(spec)

    async def delete(self, deployment_id: str) -> bool:
        self.writes.append(("delete", deployment_id))
        return await self.inner.delete(deployment_id)


def fleet(fleet_id: str, model: str, box: str, port: int, revision: str) -> Fleet:
    recipes = {model: Recipe(model, VllmRecipe(model=f"org/{model}", served_model_name=model, max_model_len=4096))}
    boxes = {box: Box(box, (ServerRow(model, port, model),))}
    settings = FleetSettings(listen_ports=(port,), fleet_id=fleet_id, reconcile=ReconcileSettings(
        probe_timeout_s=5, down_after_failures=2, up_after_successes=1, max_delete_fraction=1.0))
    return Fleet(revision * 40, settings, frozen_map(recipes), frozen_map(boxes))


def test_two_fleets_on_one_litellm_move_under_load_and_never_touch_each_other() -> None:
    proxy = proxy_from_env()
    if proxy is None:
        missing(SKIP_REASON)
    tag = secrets.token_hex(3)
    blue_id, green_id = f"blue-{tag}", f"green-{tag}"
    blue_model, green_model = f"two-fleets-blue-{tag}", f"two-fleets-green-{tag}"
    (b1, b2, g1, g2) = free_ports("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5")
    places = {"blue1": ("127.0.0.2", b1), "blue2": ("127.0.0.3", b2), "green1": ("127.0.0.4", g1),
              "green2": ("127.0.0.5", g2)}
    models = {"blue1": blue_model, "blue2": blue_model, "green1": green_model, "green2": green_model}
    ids = {f"fleetllm:{host}:{port}" for host, port in places.values()}
    stubs: list[Stub] = []
    try:
        for name, (host, port) in places.items():
            stubs.append(Stub(host, port, f"org/{models[name]}", models[name], SALT.derive(host, port)))
        asyncio.run(scenario(proxy, places, models, blue_id, green_id))
    finally:
        for ident in sorted(ids):
            proxy.call("POST", "/model/delete", {"id": ident})
        for stub in stubs:
            stub.kill()


async def scenario(proxy: LitellmProxy, places: dict[str, tuple[str, int]], models: dict[str, str], blue_id: str,
                   green_id: str) -> None:
    blue_before = fleet(blue_id, models["blue1"], *places["blue1"], "b")
    blue_after = fleet(blue_id, models["blue2"], *places["blue2"], "c")
    green_before = fleet(green_id, models["green1"], *places["green1"], "d")
    green_after = fleet(green_id, models["green2"], *places["green2"], "e")
    blue_ids = {f"fleetllm:{h}:{p}" for h, p in (places["blue1"], places["blue2"])}
    green_ids = {f"fleetllm:{h}:{p}" for h, p in (places["green1"], places["green2"])}
    recordings: dict[str, list[tuple[str, str]]] = {"blue": [], "green": []}

    def reconciler(name: str) -> Reconciler:
        def api(session: aiohttp.ClientSession) -> LitellmApi:
            recording = Recording(LitellmClient(session, proxy.url, Secret(proxy.master_key, "test")))
            recording.writes = recordings[name]
            return recording
        return Reconciler(Bearers(SALT), Observer({}, 5, 8), api, MemoryStore())

    blue, green = reconciler("blue"), reconciler("green")

    # Blue's server already routed, as written before fleet ids: the marker and no fleetllm_fleet.
    server = next(iter(intended_state(blue_before, Bearers(SALT)).servers.values()))
    legacy = desired_deployment(server, Endpoint(server.box, server.port), blue_before.revision)
    assert INFO_FLEET not in legacy.model_info
    status, body = proxy.call("POST", "/model/new", legacy.body())
    assert status == 200, body

    first_green = await green.run_pass(green_before, apply=True)  # the pass that used to delete blue's
    assert recordings["green"] == [("create", f"fleetllm:{places['green1'][0]}:{places['green1'][1]}")]
    assert legacy.id in {d.id for d in first_green.plan.drift}  # reported, not touched: maybe another fleet's

    load = Load(proxy, [models["blue1"], models["green1"]])
    runner = asyncio.create_task(load.run())
    await asyncio.sleep(2)
    adopted = await blue.run_pass(blue_before, apply=True)
    assert [(r.action.kind, r.outcome) for r in adopted.results] == [("update", "updated")], adopted.results
    assert recordings["blue"] == [("update", legacy.id)]  # in place: no delete, no create
    await asyncio.sleep(1)
    for _ in range(3):  # both move their model to another box, passes interleaved
        await blue.run_pass(blue_after, apply=True)
        await green.run_pass(green_after, apply=True)
        await asyncio.sleep(1)
    load.stopping.set()
    await runner

    print(f"two fleets under load: {load.ok} requests ok, {len(load.failed)} failed, per model {load.by_model}; "
          f"blue wrote {recordings['blue']}, green wrote {recordings['green']}")
    assert not load.failed, load.failed[:5]
    assert all(n > 0 for n in load.by_model.values()), load.by_model
    assert {i for _, i in recordings["blue"]} <= blue_ids, recordings["blue"]
    assert {i for _, i in recordings["green"]} <= green_ids, recordings["green"]
    assert sum(1 for op, _ in recordings["blue"] if op == "delete") == 1  # its own old box, after the move
    assert sum(1 for op, _ in recordings["green"] if op == "delete") == 1

    rows = {r["model_info"]["id"]: r for r in proxy.deployments()
            if r["model_info"].get("id") in blue_ids | green_ids}
    assert {i: r["model_info"].get(INFO_FLEET) for i, r in rows.items()} == {
        f"fleetllm:{places['blue2'][0]}:{places['blue2'][1]}": blue_id,
        f"fleetllm:{places['green2'][0]}:{places['green2'][1]}": green_id}
