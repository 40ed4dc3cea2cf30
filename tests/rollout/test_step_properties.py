"""Properties of the rollout step over random fleets and random changes (Hypothesis), driven pass by pass
through the simulator: LiteLLM never routes to a server that is not up (no failed request), a model never
has more servers out than its budget allows, except a single box's own servers when that box holds more of
them than the budget (a box is released whole, and only when no other server of the model is out), a model
that keeps servers in the target is never left with none routed unless one box holds all of them before
and after, and the rollout converges."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetllm.core.rollout.model import RolloutState
from tests.rollout.sim import Sim

MODELS = ("m0", "m1", "m2", "m3")
PORTS = (8001, 8002, 8003)


@st.composite
def layouts(draw: st.DrawFn) -> dict[str, list[tuple[str, int]]]:
    boxes = draw(st.integers(2, 6))
    layout: dict[str, list[tuple[str, int]]] = {}
    for b in range(boxes):
        ports = draw(st.lists(st.sampled_from(PORTS), unique=True, max_size=3))
        layout[f"box{b}"] = [(draw(st.sampled_from(MODELS)), p) for p in sorted(ports)]
    return layout


def models_of(layout: dict[str, list[tuple[str, int]]]) -> set[str]:
    return {m for rows in layout.values() for m, _ in rows}


def per_box_max(layout: dict[str, list[tuple[str, int]]], model: str) -> int:
    return max((sum(1 for m, _ in rows if m == model) for rows in layout.values()), default=0)


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(before=layouts(), after=layouts(), bump=st.sets(st.sampled_from(MODELS)), budget=st.integers(1, 2),
       load=st.integers(0, 3))
def test_random_changes_never_fail_a_request_and_converge(before: dict[str, list[tuple[str, int]]],
                                                          after: dict[str, list[tuple[str, int]]],
                                                          bump: set[str], budget: int, load: int) -> None:
    after = {box: after.get(box, []) for box in before} | after
    recipes = dict.fromkeys(MODELS, "v1")
    sim = Sim.start("r1", before, recipes, load_passes=load, budgets=dict.fromkeys(MODELS, budget))
    sim.run(2)
    sim.commit("r2", after, {m: "v2" if m in bump else "v1" for m in MODELS})
    sim.run(300)
    assert sim.rollout is not None and sim.rollout.state is RolloutState.CONVERGED, sim.steps[-1].status
    assert sim.failed_requests == [], (before, after, bump, budget, load)
    for index, step_out in enumerate(sim.unreachable):
        for model, out in step_out.items():
            # The budget, with one exception: a box holding more of a model's servers than the budget is
            # released whole, and only when no other server of the model is out: then only its own are.
            assert out <= budget or len(sim.out_on[index][model]) == 1, ("out", model, out, sim.out_on[index],
                                                                          before, after, bump, budget, load)
    for result in sim.steps:  # the step's own records: the same rule over what it counts out
        for model, keys in result.out.items():
            assert len(keys) <= budget or len({box for box, _ in keys}) == 1, ("step out", model, keys)
    kept = models_of(before) & models_of(after)
    for model in kept:
        limit = max(budget, per_box_max(before, model), per_box_max(after, model))
        assert max(step_out.get(model, 0) for step_out in sim.unreachable) <= limit, ("out", model, before, after,
                                                                                     bump, budget, load)
        # make-before-break: a model placed before and after is never left without a routed server,
        # unless one box held all of it (its restart takes it out: nothing else can), or boxes swap models
        # with no spare slot (a cycle the step breaks, saying so).
        # One box holds all of it before and after: no server elsewhere could serve meanwhile. (When the
        # target places it on another box too, that server must serve before the box's own go.)
        alone = any(all(m != model for b2, rows2 in [*before.items(), *after.items()] if b2 != b for m, _ in rows2)
                    for b, rows in before.items() if any(m == model for m, _ in rows))
        cycle = any("make-before-break is impossible" in st.why for step in sim.steps for st in step.status.values())
        replicas = sum(1 for rows in before.values() for m, _ in rows if m == model)
        if not alone and not cycle and budget < replicas:  # a budget of every replica may take them all
            assert all(r.get(model, 0) >= 1 for r in sim.routed_per_model[2:]), repr(("unrouted", model, before,
                                                                                      after, bump, budget, load))
