"""Hypothesis strategies for valid fleets drawn from small pools, so two draws share most of their
boxes, ports and models, and differ the way pull requests do."""

from __future__ import annotations

from hypothesis import assume
from hypothesis import strategies as st

from fleetllm.core.fleet.jsonvalue import freeze_mapping
from fleetllm.core.fleet.model import (
    Box,
    Fleet,
    FleetSettings,
    LitellmRoute,
    Recipe,
    ReconcileMode,
    ReconcileSettings,
    ServerRow,
    VllmRecipe,
    frozen_map,
)

MODELS = ("m1", "m2", "m3")
BOXES = ("203.0.113.1", "203.0.113.2", "pod-a")
PORTS = (8001, 8002, 8003)
LEGACY = (("203.0.113.1", 8001), ("pod-a", 8002))


@st.composite
def recipes(draw: st.DrawFn, name: str) -> Recipe:
    return Recipe(
        name=name,
        vllm=VllmRecipe(
            model=draw(st.sampled_from(("org/a", "org/b"))),
            served_model_name=draw(st.sampled_from((name, f"{name}-served"))),
            args=draw(st.sampled_from(((), ("--enforce-eager",)))),
            settings=freeze_mapping(draw(st.sampled_from(({}, {"max-num-seqs": 8})))),
            max_model_len=draw(st.sampled_from((None, 4096))),
            vram_gb=draw(st.sampled_from((None, 10.0, 12.0))),
        ),
        litellm=LitellmRoute(
            params=freeze_mapping(draw(st.sampled_from(({}, {"temperature": 0.2})))),
            model_info=freeze_mapping(draw(st.sampled_from(({}, {"context_window": 4096}, {"tier": "gold"})))),
        ),
        reconcile=draw(st.sampled_from(ReconcileMode)),
        description=draw(st.sampled_from((None, "a model"))),
    )


@st.composite
def boxes(draw: st.DrawFn, name: str) -> Box:
    ports = draw(st.lists(st.sampled_from(PORTS), unique=True, max_size=3))
    rows = []
    for port in ports:
        model = draw(st.sampled_from(MODELS))
        rows.append(ServerRow(model, port, draw(st.sampled_from((model, f"{model}-b")))))
    assume(len({r.name for r in rows}) == len(rows))
    return Box(name, tuple(rows), gpu_memory_gb=draw(st.sampled_from((None, 48.0))),
               reconcile=draw(st.sampled_from(ReconcileMode)))


@st.composite
def fleets(draw: st.DrawFn, revision: str = "rev") -> Fleet:
    names = draw(st.lists(st.sampled_from(BOXES), unique=True, min_size=1))
    settings = FleetSettings(legacy_servers=frozenset(draw(st.sets(st.sampled_from(LEGACY)))),
                             reconcile=ReconcileSettings(interval_s=draw(st.sampled_from((60, 120))),
                                                         prune=draw(st.booleans())))
    return Fleet(revision, settings, frozen_map({m: draw(recipes(m)) for m in MODELS}),
                 frozen_map({n: draw(boxes(n)) for n in names}))


@st.composite
def fleet_pairs(draw: st.DrawFn) -> tuple[Fleet, Fleet]:
    """A fleet and an edit of it: each recipe, box and setting is kept or drawn again, so most of the
    two fleets is equal and the differences are the few a pull request makes."""
    a = draw(fleets("A"))
    keep = st.booleans()
    names = [n for n in BOXES if (n in a.boxes and draw(keep)) or draw(st.booleans())]
    assume(names)
    boxes_b = {n: a.boxes[n] if n in a.boxes and draw(keep) else draw(boxes(n)) for n in names}
    recipes_b = {m: a.recipes[m] if draw(keep) else draw(recipes(m)) for m in MODELS}
    legacy = a.settings.legacy_servers if draw(keep) else frozenset(draw(st.sets(st.sampled_from(LEGACY))))
    settings = FleetSettings(legacy_servers=legacy, reconcile=a.settings.reconcile)
    return a, Fleet("B", settings, frozen_map(recipes_b), frozen_map(boxes_b))
