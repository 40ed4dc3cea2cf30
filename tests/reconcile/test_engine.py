"""Whole passes (`Reconciler.run_pass`) over HTTP fakes: LiteLLM's model API, vLLM stand-ins, a state
store. Histories persist between passes, a failed delete stays pending and is retried, and plan mode
writes nothing at all."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest

from fleetllm.adapters.litellm import LitellmClient
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
from fleetllm.core.judge.intended import Endpoint, desired_deployment, intended_state
from fleetllm.core.secret import Secret
from fleetllm.job.engine import Reconciler
from fleetllm.job.observer import Observer

from .fakes import FakeLitellmHttp, FakeServer, FakeVllm, free_port, serve

T = TypeVar("T")
SALT = Salt("engine-salt-0123456789abcdef")


def fleet(ports: list[int]) -> Fleet:
    recipes = {"m": Recipe("m", VllmRecipe(model="org/m", served_model_name="m", max_model_len=4096))}
    boxes = {"127.0.0.1": Box("127.0.0.1", tuple(ServerRow("m", p, f"m-{p}") for p in ports))}
    settings = FleetSettings(listen_ports=tuple(ports), fleet_id="test-fleet", reconcile=ReconcileSettings(
        probe_timeout_s=2, down_after_failures=1, up_after_successes=1, max_delete_fraction=1.0))
    return Fleet("e" * 40, settings, frozen_map(recipes), frozen_map(boxes))


def run(make: Callable[[], Awaitable[T]]) -> T:
    return asyncio.run(make())  # type: ignore[arg-type]


def test_passes_persist_history_and_retry_a_failed_delete() -> None:
    store = MemoryStore()
    litellm = FakeLitellmHttp()
    vllm = FakeVllm()
    down_port = free_port()

    async def scenario() -> None:
        async with serve(litellm.app()) as (lport,), serve(vllm.app(), [0]) as (up_port,):
            vllm.servers[up_port] = FakeServer("m", SALT.derive("127.0.0.1", up_port), "org/m")
            reconciler = Reconciler(Bearers(SALT), Observer({}, 2, 8),
                                    lambda s: LitellmClient(s, f"http://127.0.0.1:{lport}", Secret(litellm.master_key, "test")),
                                    store)
            both = fleet([up_port, down_port])
            planned = await reconciler.run_pass(both, apply=False)
            assert [a.kind for a in planned.plan.actions] == ["create"]
            assert litellm.rows == {}
            assert store.histories() == {}
            assert store.passes == []

            first = await reconciler.run_pass(both, apply=True)
            assert [r.outcome for r in first.results] == ["created"]
            assert set(litellm.rows) == {f"fleetllm:127.0.0.1:{up_port}"}
            assert store.histories()[("127.0.0.1", up_port)].up

            # The server dies (down after 1 failure here); LiteLLM fails the delete once.
            vllm.servers[up_port].mode = "unhealthy"
            litellm.fail_deletes = 1
            second = await reconciler.run_pass(both, apply=True)
            assert [(r.action.kind, r.ok) for r in second.results] == [("delete", False)]
            assert "503" in (second.results[0].error or "")
            pending = store.pending_deletes()
            assert pending[f"fleetllm:127.0.0.1:{up_port}"].attempts == 1
            assert not store.passes[-1].ok

            third = await reconciler.run_pass(both, apply=True)
            assert "retry: 1 failed attempt(s)" in third.plan.actions[0].reason
            assert [r.outcome for r in third.results] == ["deleted"]
            assert store.pending_deletes() == {}
            assert litellm.rows == {}
            assert store.passes[-1].ok
            assert store.passes[-1].verdicts == {"Down": 1, "Pending": 1}

    run(scenario)


def test_a_fleet_without_an_id_is_refused_when_new_and_adopts_in_place_when_existing() -> None:
    """fleet.yaml without fleet_id: a new fleet (nothing of its boxes in LiteLLM) is refused before any
    write; an existing one (a deployment of its box written before fleet ids) gets the id derived from
    its repository's first commit, said in the plan, and its deployment is updated into it in place."""
    from fleetllm.core.judge.ownership import FleetIdError

    litellm, vllm = FakeLitellmHttp(), FakeVllm()
    root = "c0ffee" + "0" * 34

    async def scenario() -> None:
        async with serve(litellm.app()) as (lport,), serve(vllm.app(), [0]) as (port,):
            vllm.servers[port] = FakeServer("m", SALT.derive("127.0.0.1", port), "org/m")
            reconciler = Reconciler(Bearers(SALT), Observer({}, 2, 8),
                                    lambda s: LitellmClient(s, f"http://127.0.0.1:{lport}", Secret(litellm.master_key, "test")),
                                    MemoryStore())
            named = fleet([port])
            unnamed = dataclasses.replace(named, settings=dataclasses.replace(named.settings, fleet_id=None),
                                          origin=root)
            with pytest.raises(FleetIdError, match="fleet_id is required for a new fleet"):
                await reconciler.run_pass(unnamed, apply=True)
            assert litellm.rows == {}

            # as written before fleet ids: the same pass with no fleet id at all (the pure planner's way)
            legacy = dataclasses.replace(intended_state(named, Bearers(SALT)), fleet_id=None)
            server = next(iter(legacy.servers.values()))
            spec = desired_deployment(server, Endpoint(server.box, server.port), named.revision)
            litellm.rows[spec.id] = {"model_name": spec.model_name, "litellm_params": dict(spec.litellm_params),
                                     "model_info": dict(spec.model_info)}
            adopted = await reconciler.run_pass(unnamed, apply=True)
            assert [(str(r.action.kind), str(r.outcome)) for r in adopted.results] == [("update", "updated")]
            assert any("add `fleet_id: git-c0ffee000000` to fleet.yaml" in w for w in adopted.plan.warnings)
            assert litellm.rows[spec.id]["model_info"]["fleetllm_fleet"] == "git-c0ffee000000"
            again = await reconciler.run_pass(unnamed, apply=True)
            assert again.plan.empty

    run(scenario)


def test_a_fleet_without_an_id_goes_on_when_its_litellm_is_emptied_and_a_new_one_is_still_refused() -> None:
    """The existing fleet's passes record its derived id in the state store; LiteLLM is emptied (a reset
    proxy): the next pass recreates its deployment under that id instead of refusing the fleet as new. The
    same fleet with a fresh state store (a truly new fleet: no deployment, no history) is refused, and a
    plan-only pass or a refused one records nothing."""
    from fleetllm.core.judge.ownership import FleetIdError

    litellm, vllm = FakeLitellmHttp(), FakeVllm()
    root = "c0ffee" + "0" * 34
    store, fresh = MemoryStore(), MemoryStore()

    async def scenario() -> None:
        async with serve(litellm.app()) as (lport,), serve(vllm.app(), [0]) as (port,):
            vllm.servers[port] = FakeServer("m", SALT.derive("127.0.0.1", port), "org/m")

            def reconciler(state: MemoryStore) -> Reconciler:
                return Reconciler(Bearers(SALT), Observer({}, 2, 8), lambda s: LitellmClient(
                    s, f"http://127.0.0.1:{lport}", Secret(litellm.master_key, "test")), state)

            named = fleet([port])
            unnamed = dataclasses.replace(named, settings=dataclasses.replace(named.settings, fleet_id=None),
                                          origin=root)
            legacy = dataclasses.replace(intended_state(named, Bearers(SALT)), fleet_id=None)
            server = next(iter(legacy.servers.values()))
            spec = desired_deployment(server, Endpoint(server.box, server.port), named.revision)
            litellm.rows[spec.id] = {"model_name": spec.model_name, "litellm_params": dict(spec.litellm_params),
                                     "model_info": dict(spec.model_info)}
            await reconciler(store).run_pass(unnamed, apply=False)  # plan only: records nothing
            assert store.recorded_fleet_id() is None
            await reconciler(store).run_pass(unnamed, apply=True)  # adopted, and its id recorded
            assert store.recorded_fleet_id() == "git-c0ffee000000"

            litellm.rows.clear()  # LiteLLM emptied
            with pytest.raises(FleetIdError, match="fleet_id is required for a new fleet"):
                await reconciler(fresh).run_pass(unnamed, apply=True)  # no history: new, refused
            assert litellm.rows == {} and fresh.recorded_fleet_id() is None and fresh.passes == []
            recreated = await reconciler(store).run_pass(unnamed, apply=True)
            assert [(str(r.action.kind), str(r.outcome)) for r in recreated.results] == [("create", "created")]
            assert [row["model_info"]["fleetllm_fleet"] for row in litellm.rows.values()] == ["git-c0ffee000000"]
            assert any("add `fleet_id: git-c0ffee000000` to fleet.yaml" in w for w in recreated.plan.warnings)

    run(scenario)
