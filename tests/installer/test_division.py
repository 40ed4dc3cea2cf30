"""fleetllm_contract.division: the stable card division and box_change (issue 14, item 4)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleetllm_contract.division import CEILING, Demand, box_change, divide, fresh, need_gb, rounded

CARD = st.floats(min_value=8, max_value=200)
NAMES = st.sampled_from([f"s{i}" for i in range(8)])


@st.composite
def demands(draw: st.DrawFn, names: frozenset[str] | None = None) -> list[Demand]:
    chosen = names if names is not None else draw(st.frozensets(NAMES, min_size=1, max_size=5))
    out = []
    for name in sorted(chosen):
        fixed = draw(st.none() | st.floats(min_value=0.01, max_value=0.3))
        out.append(Demand(name, draw(st.floats(min_value=0, max_value=30)), fixed,
                          draw(st.none() | st.floats(min_value=0.1, max_value=10))))
    return out


@given(old=demands(), new=demands(), total=CARD)
def test_unchanged_servers_keep_their_shares_whenever_the_new_set_fits(old: list[Demand], new: list[Demand],
                                                                         total: float) -> None:
    if sum(d.fixed * total if d.fixed is not None else d.weights_gb for d in old) > CEILING * total:
        return  # the fit check refuses this base: nothing ran with these shares
    before = {k: rounded(v) for k, v in fresh(old, total).items()}
    names = {d.name for d in new}
    current = {k: v for k, v in before.items() if k in names and v > 0}
    division = divide(new, total, current)
    auto_new = {d.name: d for d in new if d.fixed is None}
    kept = {k: v for k, v in current.items() if k in auto_new}
    fixed = sum(d.fixed * total for d in new if d.fixed is not None)
    fits = (all((v + 0.001) * total + 1e-9 >= auto_new[k].weights_gb for k, v in kept.items())
            and sum(need_gb(d, total) for n, d in auto_new.items() if n not in kept)
            <= CEILING * total - fixed - sum(v * total for v in kept.values()) + 1e-9)
    if kept and fits:
        assert division.kept == frozenset(kept)
        assert not division.redivided
        for name, share in kept.items():
            assert division.shares[name] == share
    else:
        assert division.kept == frozenset()


@given(old=demands(), new=demands(), total=CARD)
def test_shares_never_exceed_the_card(old: list[Demand], new: list[Demand], total: float) -> None:
    current = {k: rounded(v) for k, v in fresh(old, total).items() if k in {d.name for d in new}}
    division = divide(new, total, current)
    fixed = sum(d.fixed for d in new if d.fixed is not None)
    reserved = fixed * total + sum(d.weights_gb for d in new if d.fixed is None)
    if reserved <= CEILING * total:  # else the fit check refuses the set (fleetllm_installer.fit)
        assert sum(rounded(v) for v in division.shares.values()) + fixed <= CEILING + 1e-9
    assert all(v >= 0 for v in division.shares.values())


@given(new=demands(), total=CARD, seed=st.randoms())
def test_deterministic_whatever_the_order(new: list[Demand], total: float, seed: Any) -> None:
    shuffled = list(new)
    seed.shuffle(shuffled)
    current = {new[0].name: 0.2} if new[0].fixed is None else {}
    assert divide(new, total, current) == divide(shuffled, total, current)


def test_fresh_division_is_the_installers_formula() -> None:
    # 80 GB card, 72 GB usable; weights 10 + 30 leave 32, 16 each (tests/installer/test_fit.py)
    shares = fresh([Demand("a", 10), Demand("b", 30)], 80)
    assert shares == {"a": pytest.approx(0.325), "b": pytest.approx(0.575)}


def test_rounding_tolerates_floating_point_error() -> None:
    assert rounded(0.415) == 0.415
    assert rounded(0.4159) == 0.415


def box(*servers: tuple[str, int, float], **extra: Any) -> dict[str, Any]:
    return {"host": "b", "servers": [{"name": n, "port": p, "vram_gb": v, "digest": f"d-{n}-{p}-{v}",
                                      "api_key": "k", **extra.get(n, {})} for n, p, v in servers]}


def test_box_change_adding_a_server_that_fits_restarts_nothing_else() -> None:
    old = box(("a", 8001, 10))  # a alone: 0.9 of the card
    change = box_change(old, box(("a", 8001, 10), ("b", 8002, 10)), 80, current={"a": 0.5})
    assert change.started == {"b"} and change.unchanged == {"a"} and not change.restarted


def test_box_change_adding_a_server_that_does_not_fit_restarts_the_neighbour() -> None:
    change = box_change(box(("a", 8001, 10)), box(("a", 8001, 10), ("b", 8002, 10)), 80)
    assert change.started == {"b"}
    assert change.restarted == {"a"}
    assert change.redivided


def test_box_change_removing_a_server_restarts_nothing() -> None:
    change = box_change(box(("a", 8001, 10), ("b", 8002, 30)), box(("a", 8001, 10)), 80)
    assert change == box_change(box(("a", 8001, 10), ("b", 8002, 30)), box(("a", 8001, 10)), 80)
    assert change.stopped == {"b"} and change.unchanged == {"a"} and not change.restarted


def test_box_change_boot_field_and_bearer_changes_restart() -> None:
    old = box(("a", 8001, 10), ("b", 8002, 10))
    new = box(("a", 8001, 10), ("b", 8002, 10), b={"digest": "other"})
    assert box_change(old, new, 80).restarted == {"b"}
    new = box(("a", 8001, 10), ("b", 8002, 10), a={"api_key": "new"})
    assert box_change(old, new, 80).restarted == {"a"}


def test_box_change_without_a_card_size_counts_neighbours_when_demand_grows() -> None:
    old = box(("a", 8001, 10))
    grown = box_change(old, box(("a", 8001, 10), ("b", 8002, 10)), None)
    assert grown.restarted == {"a"} and not grown.card_known
    shrunk = box_change(box(("a", 8001, 10), ("b", 8002, 10)), old, None)
    assert not shrunk.restarted and shrunk.unchanged == {"a"}


def test_box_change_leaves_servers_with_their_own_utilization_alone() -> None:
    old = box(("a", 8001, 10), a={"gpu_memory_utilization": 0.3})
    new = box(("a", 8001, 10), ("b", 8002, 10), a={"gpu_memory_utilization": 0.3})
    assert box_change(old, new, 80).unchanged == {"a"}


@given(old=demands(), total=CARD, data=st.data())
def test_removing_servers_never_moves_the_others(old: list[Demand], total: float, data: st.DataObject) -> None:
    reserved = sum(d.fixed * total if d.fixed is not None else d.weights_gb for d in old)
    if reserved > CEILING * total:
        return  # the fit check refuses this card in the first place
    before = {k: rounded(v) for k, v in fresh(old, total).items()}
    left = data.draw(st.lists(st.sampled_from(old), unique_by=lambda d: d.name, min_size=1))
    current = {d.name: before[d.name] for d in left if d.name in before and before[d.name] > 0}
    division = divide(left, total, current)
    assert {k: division.shares[k] for k in current} == current
