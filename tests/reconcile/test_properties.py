"""Properties of plan + apply over random observed states (hypothesis), against an in-memory LiteLLM
with LiteLLM's semantics: convergence, idempotence, ownership, convergence under random failures,
no delete on a failed observation, the delete budget, and a crash after every k-th action."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import Mapping

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetllm.core.fleet.model import Provider
from fleetllm.core.judge.assess import Assessment
from fleetllm.core.judge.intended import Endpoint, Intended, IntendedServer
from fleetllm.core.judge.observed import BoxFacts, Deployment, ProbeResult, ProbeStatus, ProviderListing
from fleetllm.core.judge.plan import ActionKind, Plan, delete_budget, make_plan
from fleetllm.job.apply import apply_plan

from .builders import NOW, SETTINGS, assessed, deployment_for, intended, observation, ok, server, unmanaged
from .fake_litellm import FakeLitellm

BOXES = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
PORTS = [8001, 8002, 8003]
MODELS = ["qwen", "llama", "gemma"]
PROBES = [ProbeStatus.OK, ProbeStatus.OK, ProbeStatus.REFUSED, ProbeStatus.TIMEOUT, ProbeStatus.UNAUTHORIZED,
          ProbeStatus.WRONG_MODEL, ProbeStatus.ERROR]


@dataclasses.dataclass
class World:
    want: Intended
    probes: dict[tuple[str, int], ProbeResult]
    rows: dict[str, Deployment]
    unmanaged_ids: frozenset[str]
    facts: dict[str, BoxFacts]
    listing_failed: bool

    def observe(self, fake: FakeLitellm) -> tuple[Plan, Assessment]:
        listings = ({Provider.VAST: ProviderListing(Provider.VAST, error="HTTP 503")} if self.listing_failed else {})
        rows = None if fake.list_fails else fake.rows.values()
        obs = observation(self.want, self.probes, rows, facts=self.facts, listings=listings)
        assessment = assessed(self.want, obs)
        return make_plan(self.want, obs, assessment), assessment


@st.composite
def worlds(draw: st.DrawFn) -> World:
    slots = [(b, p) for b in BOXES for p in PORTS]
    chosen = draw(st.lists(st.sampled_from(slots), unique=True, max_size=7))
    servers: list[IntendedServer] = []
    for box, port in chosen:
        s = server(box, port, draw(st.sampled_from(MODELS)), paused=draw(st.booleans()) and draw(st.booleans()))
        servers.append(s)
    want = intended(servers, dataclasses.replace(SETTINGS, max_deletes_per_pass=draw(st.integers(0, 12)),
                                                 max_delete_fraction=draw(st.sampled_from([0.34, 0.5, 1.0]))))
    probes: dict[tuple[str, int], ProbeResult] = {}
    for s in servers:
        status = draw(st.sampled_from(PROBES))
        probes[s.key] = ok(s) if status is ProbeStatus.OK else ProbeResult(status, str(status))
    rows: dict[str, Deployment] = {}
    for box, port in draw(st.lists(st.sampled_from(slots), unique=True, max_size=6)):
        # An existing managed deployment: for an intended server or an orphan, maybe out of date.
        model = draw(st.sampled_from(MODELS))
        public = draw(st.sampled_from([port, 41000 + port]))
        d = deployment_for(server(box, port, model), Endpoint(box, public))
        rows[d.id] = d
    unmanaged_ids: set[str] = set()
    for i in range(draw(st.integers(0, 3))):
        ident = draw(st.sampled_from([f"cfg-{i}", f"fleetllm:{BOXES[i % 3]}:8001", f"hand-{i}"]))
        if ident not in rows:
            rows[ident] = unmanaged(ident)
            unmanaged_ids.add(ident)
    facts = {b: BoxFacts(NOW - draw(st.sampled_from([30, 3600]))) for b in BOXES if draw(st.booleans())}
    return World(want, probes, rows, frozenset(unmanaged_ids), facts, draw(st.booleans()) and draw(st.booleans()))


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


PROPS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def unmanaged_rows(fake: FakeLitellm, world: World) -> Mapping[str, Deployment]:
    return {i: fake.rows[i] for i in world.unmanaged_ids if i in fake.rows}


@PROPS
@given(worlds())
def test_one_apply_converges_and_a_second_is_a_no_op(world: World) -> None:
    fake = FakeLitellm(dict(world.rows))
    plan, assessment = world.observe(fake)
    results = run(apply_plan(plan, fake))
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    # Convergence: the same verdicts over the new LiteLLM state plan nothing.
    obs = observation(world.want, world.probes, fake.rows.values(), facts=world.facts,
                      listings=({Provider.VAST: ProviderListing(Provider.VAST, error="x")}
                                if world.listing_failed else {}))
    after = make_plan(world.want, obs, assessment)
    if plan.blocked:  # held deletes may be allowed now that the managed count changed; nothing else
        assert all(a.kind is ActionKind.DELETE for a in after.actions)
    else:
        assert after.empty
    # Idempotence: the same plan again writes nothing.
    before = dict(fake.rows)
    writes = len(fake.writes)
    again = run(apply_plan(plan, fake))
    assert all(r.outcome in ("already present", "already gone") for r in again)
    assert fake.rows == before
    assert len(fake.writes) == writes
    # Ownership: unmanaged rows untouched.
    assert unmanaged_rows(fake, world) == {i: world.rows[i] for i in world.unmanaged_ids}


@PROPS
@given(worlds())
def test_no_delete_on_a_failed_observation_and_never_beyond_the_budget(world: World) -> None:
    fake = FakeLitellm(dict(world.rows))
    plan, _ = world.observe(fake)
    deletes = plan.count(ActionKind.DELETE)
    if world.listing_failed:
        assert deletes == 0
    managed = sum(1 for d in world.rows.values() if d.managed)
    s = world.want.settings
    assert deletes <= delete_budget(s.max_deletes_per_pass, s.max_delete_fraction, managed)
    for action in plan.actions:
        if action.kind in (ActionKind.DELETE, ActionKind.UPDATE, ActionKind.REPLACE):
            assert action.id not in world.unmanaged_ids
    fake.list_fails = True
    blind, _ = world.observe(fake)
    assert blind.empty


@PROPS
@given(worlds(), st.integers(0, 2**32 - 1))
def test_repeated_passes_converge_under_random_failures(world: World, seed: int) -> None:
    fake = FakeLitellm(dict(world.rows), fail_rate=0.3, rng=random.Random(seed))
    world.want = dataclasses.replace(world.want, settings=dataclasses.replace(
        world.want.settings, max_deletes_per_pass=100, max_delete_fraction=1.0))
    for _ in range(30):
        plan, _ = world.observe(fake)
        if plan.empty:
            break
        run(apply_plan(plan, fake))
    else:
        raise AssertionError("did not converge in 30 passes")
    assert fake.duplicate_creates == 0
    assert unmanaged_rows(fake, world) == {i: world.rows[i] for i in world.unmanaged_ids}


@PROPS
@given(worlds())
def test_crash_after_every_kth_action_then_a_new_pass_converges(world: World) -> None:
    # A budget that never binds here: how the budget moves with the managed count is not the point.
    world.want = dataclasses.replace(world.want, settings=dataclasses.replace(
        world.want.settings, max_deletes_per_pass=100, max_delete_fraction=1.0))
    fake0 = FakeLitellm(dict(world.rows))
    plan, _ = world.observe(fake0)
    for k in range(len(plan.actions) + 1):
        fake = FakeLitellm(dict(world.rows))
        crashed = dataclasses.replace(plan, actions=plan.actions[:k])  # the process died after k actions
        run(apply_plan(crashed, fake))
        replan, _ = world.observe(fake)  # a new process: only what LiteLLM says
        assert all(r.ok for r in run(apply_plan(replan, fake)))
        final, _ = world.observe(fake)
        assert final.empty
        assert fake.duplicate_creates == 0
