"""Faults during reconcile, at the HTTP seam: whole passes of the real Reconciler (observer, judge,
planner, apply, state) against stateful fakes of LiteLLM, Vast and vLLM on loopback sockets.

The fleet: a static box (127.0.0.1) and a Vast box (127.0.0.2, listed on the third page of a
60-instance listing). It first converges at revision A; then revision B drops a server (one delete),
changes a model's LiteLLM route (two updates) and adds a server (one create). The fault is on for
the first passes of B, then cleared. For every fault: while it lasts nothing is deleted on a failed
observation; after it clears the fleet converges (an empty plan) within a few passes; no deployment
is created twice; the two rows fleetllm does not manage are never written. The properties over
random worlds of the same (in-memory) are tests/reconcile/test_properties.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from fleetllm.adapters.http import RetryPolicy
from fleetllm.adapters.litellm import LitellmClient
from fleetllm.adapters.providers import ProviderAccess, VastClient
from fleetllm.adapters.state.reconcile import MemoryStore
from fleetllm.core.fleet.bearer import Salt
from fleetllm.core.fleet.model import (
    Box,
    Fleet,
    FleetSettings,
    LitellmRoute,
    Provider,
    Recipe,
    ReconcileSettings,
    ServerRow,
    VllmRecipe,
    frozen_map,
)
from fleetllm.core.fleet.render import Bearers
from fleetllm.core.judge.plan import ActionKind
from fleetllm.core.secret import Secret
from fleetllm.job.engine import PassOutcome, Reconciler
from fleetllm.job.observer import Observer
from tests.reconcile.fakes import FakeServer, FakeVllm, free_port, serve, vast_instance
from tests.support.faulty_http import FaultyLitellm, FaultyVast

SALT = Salt("faults-reconcile-salt-0123456789")
STATIC, VAST_BOX = "127.0.0.1", "127.0.0.2"
MAX_PASSES = 8
HAND_MADE = {"model_name": "hand", "litellm_params": {"model": "openai/hand", "api_base": "http://127.0.0.9:9/v1"},
             "model_info": {"id": "hand-made-1"}}


def settings(**knobs: Any) -> ReconcileSettings:
    return ReconcileSettings(**{"probe_timeout_s": 0.5, "down_after_failures": 2, "up_after_successes": 1,
                                "max_deletes_per_pass": 10, "max_delete_fraction": 1.0, **knobs})


def fleet(revision: str, static_ports: list[int], vast_port: int, route: str, knobs: ReconcileSettings) -> Fleet:
    recipes = {name: Recipe(name, VllmRecipe(model=f"org/{name}", served_model_name=name, max_model_len=4096),
                            LitellmRoute(model_info=frozen_map({"tier": route} if name == "m" else {})))
               for name in ("m", "n")}
    rows = tuple(ServerRow("m" if i < 2 else "n", p, f"s{p}") for i, p in enumerate(static_ports))
    boxes = {STATIC: Box(STATIC, rows, Provider.STATIC),
             VAST_BOX: Box(VAST_BOX, (ServerRow("n", vast_port, "v"),), Provider.VAST)}
    ports = (*static_ports, vast_port)
    return Fleet(revision * 40, FleetSettings(listen_ports=ports, reconcile=knobs, fleet_id="test-fleet"), frozen_map(recipes),
                 frozen_map(boxes))


@dataclass
class World:
    """The fakes on loopback, the two revisions, and a Reconciler with its store kept between passes."""

    litellm: FaultyLitellm = field(default_factory=FaultyLitellm)
    vast: FaultyVast = field(default_factory=FaultyVast)
    vllm: FakeVllm = field(default_factory=FakeVllm)
    litellm_url: str = ""
    vast_url: str = ""
    store: MemoryStore = field(default_factory=MemoryStore)
    a: Fleet | None = None
    b: Fleet | None = None
    litellm_down: bool = False
    timeout_s: float = 1.0

    def reconciler(self) -> Reconciler:
        dead = f"http://127.0.0.1:{free_port()}"
        access = ProviderAccess(Secret("vast-test-key", "test"), self.vast_url, timeout_s=self.timeout_s,
                                retry=RetryPolicy(attempts=3, base_delay_s=0.01))
        return Reconciler(Bearers(SALT), Observer({Provider.VAST: VastClient(access)}, 0.5, 16),
                          lambda s: LitellmClient(s, dead if self.litellm_down else self.litellm_url,
                                                  Secret(self.litellm.master_key, "test"), self.timeout_s,
                                                  read_retry=RetryPolicy(attempts=2, base_delay_s=0.01)),
                          self.store)

    async def run(self, target: Fleet) -> PassOutcome:
        return await self.reconciler().run_pass(target, apply=True)

    def unmanaged(self) -> dict[str, Any]:
        return {i: r for i, r in self.litellm.rows.items() if not i.startswith("fleetllm:")}


@contextlib.asynccontextmanager
async def world(knobs: ReconcileSettings | None = None) -> AsyncIterator[World]:
    w = World()
    knobs = knobs or settings()
    async with serve(w.litellm.app()) as (lport,), serve(w.vast.app()) as (vport,), \
            serve(w.vllm.app(), [0, 0, 0, 0]) as static_ports, serve(w.vllm.app(), [0], host=VAST_BOX) as (vast_listen,):
        s1, s2, s3, s4 = static_ports
        for port in static_ports:
            w.vllm.servers[(STATIC, port)] = FakeServer("m" if port in (s1, s2) else "n", SALT.derive(STATIC, port),
                                                        "org/m" if port in (s1, s2) else "org/n", 4096)
        vast_port = 18000 + vast_listen % 1000  # the listen port in the repository; Vast maps it to vast_listen
        w.vllm.servers[(VAST_BOX, vast_listen)] = FakeServer("n", SALT.derive(VAST_BOX, vast_port), "org/n", 4096)
        filler = [vast_instance(1000 + i, f"127.0.1.{i}", None, status="exited") for i in range(59)]
        w.vast.instances = [*filler[:55], vast_instance(77, VAST_BOX, {vast_port: vast_listen}), *filler[55:]]
        w.litellm_url, w.vast_url = f"http://127.0.0.1:{lport}", f"http://127.0.0.1:{vport}"
        w.litellm.rows["hand-made-1"] = HAND_MADE
        w.a = fleet("a", [s1, s2, s3], vast_port, "a", knobs)
        w.b = fleet("b", [s1, s2, s4], vast_port, "b", knobs)
        first = await w.run(w.a)  # A converged; rows for s1, s2, s3 and the Vast box
        assert [r.outcome for r in first.results] == ["created"] * 4
        # A row that looks like ours but has no marker (a human copied an id): never written.
        w.litellm.rows[f"fleetllm:{STATIC}:{s4}x"] = {"model_name": "m", "litellm_params": {"model": "hosted_vllm/m"},
                                                      "model_info": {"id": f"fleetllm:{STATIC}:{s4}x"}}
        w.litellm.log.clear()
        yield w


@dataclass
class Figures:
    fault_passes: int = 0
    passes_to_converge: int = 0
    deletes_during_fault: int = 0
    deletes_held: int = 0
    duplicate_creates: int = 0
    writes: int = 0


async def converge(w: World, fault_passes: int, inject: Callable[[World], None],
                   clear: Callable[[World], None]) -> Figures:
    """B with the fault on for `fault_passes` passes, then off until the plan is empty."""
    assert w.b is not None
    figures = Figures(fault_passes=fault_passes)
    unmanaged = w.unmanaged()
    inject(w)
    for _ in range(fault_passes):
        deleted_before = len(w.litellm.done("delete"))
        outcome = await w.run(w.b)
        if outcome.plan.errors:  # a failed observation: not one delete
            assert len(w.litellm.done("delete")) == deleted_before, outcome.plan.errors
            figures.deletes_held += sum(1 for h in outcome.plan.held if h.kind is ActionKind.DELETE)
        figures.deletes_during_fault += len(w.litellm.done("delete")) - deleted_before
    clear(w)
    for n in range(1, MAX_PASSES + 1):
        outcome = await w.run(w.b)
        if outcome.plan.empty and not outcome.plan.held and not outcome.plan.errors:
            figures.passes_to_converge = n
            break
    else:
        raise AssertionError(f"not converged after {MAX_PASSES} passes: {outcome.plan}")
    managed = {i: r["model_name"] for i, r in w.litellm.rows.items()
               if r["model_info"].get("managed_by") == "fleetllm"}
    s1, s2, s4 = (row.port for row in w.b.boxes[STATIC].servers)
    vast_port = w.b.boxes[VAST_BOX].servers[0].port
    assert managed == {f"fleetllm:{STATIC}:{s1}": "m", f"fleetllm:{STATIC}:{s2}": "m", f"fleetllm:{STATIC}:{s4}": "n",
                       f"fleetllm:{VAST_BOX}:{vast_port}": "n"}
    assert all(w.litellm.rows[f"fleetllm:{STATIC}:{p}"]["model_info"]["tier"] == "b" for p in (s1, s2))
    assert w.unmanaged() == unmanaged
    assert w.litellm.duplicate_creates == 0
    assert not [i for i in w.litellm.done("delete") if i not in managed and not i.startswith("fleetllm:")]
    figures.duplicate_creates = w.litellm.duplicate_creates
    figures.writes = len(w.litellm.log)
    return figures


def litellm_down(w: World) -> None:
    w.litellm_down = True


def litellm_slow(w: World) -> None:
    w.litellm.delay_s = 2 * w.timeout_s


def litellm_listing_500(w: World) -> None:
    w.litellm.fail_listing = True


def writes_fail_after_one(w: World) -> None:
    w.litellm.writes_allowed = 1


def writes_lost_after_one(w: World) -> None:
    w.litellm.writes_allowed, w.litellm.lost_answers = 1, True


def vast_hangs(w: World) -> None:
    w.vast.hang = True


def vast_429(w: World) -> None:
    w.vast.throttle = w.vast.calls + 100


def vast_paging_stuck(w: World) -> None:
    w.vast.repeat_token = True


def heal(w: World) -> None:
    w.litellm_down = False
    w.litellm.healthy()
    w.vast.healthy()


CASES = {
    "litellm down": litellm_down,
    "litellm slow (answers after the client timeout)": litellm_slow,
    "litellm listing answers 500": litellm_listing_500,
    "litellm 500 mid-apply, write not done": writes_fail_after_one,
    "litellm 500 mid-apply, write done (lost answer)": writes_lost_after_one,
    "vast listing times out": vast_hangs,
    "vast listing 429 beyond the retries": vast_429,
    "vast paging does not advance": vast_paging_stuck,
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_fault_then_convergence(case: str, figures: Callable[..., None]) -> None:
    async def scenario() -> Figures:
        async with world() as w:
            return await converge(w, 2, CASES[case], heal)

    result = asyncio.run(scenario())
    if case.startswith("vast") or "mid-apply" not in case:
        assert result.deletes_during_fault == 0
    figures(case=case, **dataclasses.asdict(result))


def test_a_hanging_probe_is_bounded_and_deletes_only_through_hysteresis(figures: Callable[..., None]) -> None:
    """A server whose /health hangs: every pass still ends (the probe times out), its deployment stays
    through down_after_failures - 1 passes, and goes only at the N-th; other servers are untouched."""

    async def scenario() -> dict[str, Any]:
        async with world() as w:
            assert w.a is not None
            s1 = w.a.boxes[STATIC].servers[0].port
            w.vllm.servers[(STATIC, s1)].mode = "hang"
            ident = f"fleetllm:{STATIC}:{s1}"
            first = await w.run(w.a)
            assert ident in w.litellm.rows and first.plan.empty
            assert "no answer within 0.5s" in first.plan.judgements[(STATIC, s1)].reason
            second = await w.run(w.a)
            assert [(a.kind, a.id) for a in second.plan.actions] == [(ActionKind.DELETE, ident)]
            assert ident not in w.litellm.rows
            w.vllm.servers[(STATIC, s1)].mode = "ok"
            third = await w.run(w.a)
            assert [(a.kind, a.id) for a in third.plan.actions] == [(ActionKind.CREATE, ident)]
            assert (await w.run(w.a)).plan.empty
            return {"pass_s": round(first.record.duration_s, 2), "kept_passes": 1, "deleted_at_pass": 2,
                    "back_at_pass": 3}

    figures(case="probe hangs", **asyncio.run(scenario()))


def test_a_truncated_listing_deletes_nothing_until_it_persists(figures: Callable[..., None]) -> None:
    """Vast silently drops the pages after the first: its box is not in the listing. One such listing is
    not proof the box is gone: Missing takes the probes' hysteresis (down_after_failures passes in a row),
    so a listing that heals before then costs nothing; one that persists deletes, within the budget."""

    async def scenario() -> dict[str, Any]:
        async with world(settings(max_delete_fraction=0.25)) as w:
            assert w.a is not None
            w.vast.truncate = True
            vast_id = f"fleetllm:{VAST_BOX}:{w.a.boxes[VAST_BOX].servers[0].port}"
            outcome = await w.run(w.a)
            judged = [j for k, j in outcome.plan.judgements.items() if k[0] == VAST_BOX]
            assert [str(j.verdict) for j in judged] == ["Healthy"] and "Missing after" in judged[0].reason
            assert outcome.plan.count(ActionKind.DELETE) == 0 and not w.litellm.done("delete")
            w.vast.healthy()
            assert (await w.run(w.a)).plan.empty and vast_id in w.litellm.rows  # healed: nothing happened
            for _ in range(2):  # clear the hysteresis window (2N-1 passes) before the next fault
                assert (await w.run(w.a)).plan.empty
            w.vast.truncate = True
            passes = 0
            while vast_id in w.litellm.rows and passes < 10:
                passes += 1
                persisting = await w.run(w.a)
                assert persisting.plan.count(ActionKind.DELETE) <= 1  # budget: max(1, floor(0.25 * 4))
            assert passes == 2  # down_after_failures (2 here): Missing at the second listing in a row without it
            w.vast.healthy()
            while (await w.run(w.a)).plan.actions:
                pass
            assert vast_id in w.litellm.rows and w.litellm.duplicate_creates == 0
            return {"deleted_after_healing_listing": 0, "passes_before_delete_when_persisting": passes}

    figures(case="vast listing truncated", **asyncio.run(scenario()))
