"""Retiring a box that left the placement (issue 25, item 1): the pure pass of core.rollout.retire, and the
rollout step releasing a box that is placed neither at its release nor at the target."""

from __future__ import annotations

from dataclasses import replace

from fleetllm.core.rollout.model import BoxInput, BoxRelease, BoxState, Rollout, RolloutState, StepInput
from fleetllm.core.rollout.retire import (
    EmptyReport,
    RetireInput,
    Retirement,
    RetireState,
    forgotten,
    retire_step,
    retiring_document,
)
from fleetllm.core.rollout.step import step

T0, T1, T2 = "0" * 40, "1" * 40, "2" * 40
GONE = "10.0.0.9"


def inp(**kw: object) -> RetireInput:
    base = RetireInput(target=T1, placed=frozenset({"10.0.0.1"}), known={GONE: T0, "10.0.0.1": T1},
                       retirements={}, reports={}, released_target=frozenset(), managed=frozenset({GONE}),
                       remaining=frozenset(), now=100.0, retire_s=3600)
    return replace(base, **kw)  # type: ignore[arg-type]


def test_a_box_that_left_drains_while_its_deployments_remain_or_its_release_is_older() -> None:
    still_routed = retire_step(inp(remaining=frozenset({GONE}), released_target=frozenset({GONE})))
    assert still_routed.retirements[GONE].state is RetireState.DRAINING
    assert still_routed.retirements[GONE].revision == T1 and still_routed.retirements[GONE].kept_revision == T0
    not_released = retire_step(inp())  # the rollout still drains it (its release is T0)
    assert not_released.retirements[GONE].state is RetireState.DRAINING
    unlisted = retire_step(inp(remaining=None, released_target=frozenset({GONE})))
    assert unlisted.retirements[GONE].state is RetireState.DRAINING
    assert "10.0.0.1" not in not_released.retirements  # a placed box never retires
    assert not still_routed.forget


def test_drained_and_released_the_target_it_retires_then_is_retired_by_its_empty_report() -> None:
    first = retire_step(inp(released_target=frozenset({GONE})))
    record = first.retirements[GONE]
    assert record.state is RetireState.RETIRING and record.retiring_at == 100.0
    assert first.changed == {GONE: record} and not first.forget
    old = {GONE: EmptyReport(T1, 90.0, True)}  # before it was told to retire: not its answer
    assert retire_step(inp(retirements=first.retirements, reports=old, now=110.0)).retirements[GONE] == record
    busy = {GONE: EmptyReport(T1, 105.0, False)}  # still runs a server
    assert retire_step(inp(retirements=first.retirements, reports=busy, now=110.0)).retirements[GONE] == record
    done = retire_step(inp(retirements=first.retirements, reports={GONE: EmptyReport(T1, 105.0, True)}, now=110.0))
    assert done.retirements[GONE].state is RetireState.RETIRED
    assert done.retirements[GONE].reason == "it reported that it runs no server"
    assert done.forget == {GONE}
    again = retire_step(inp(retirements=done.retirements, now=120.0, managed=frozenset()))
    assert again.retirements[GONE] == done.retirements[GONE] and not again.changed and not again.forget


def test_a_box_that_never_reports_is_retired_after_retire_s() -> None:
    first = retire_step(inp(released_target=frozenset({GONE}), retire_s=60))
    waiting = retire_step(inp(retirements=first.retirements, now=159.0, retire_s=60))
    assert waiting.retirements[GONE].state is RetireState.RETIRING
    late = retire_step(inp(retirements=first.retirements, now=160.0, retire_s=60))
    assert late.retirements[GONE].state is RetireState.RETIRED and late.forget == {GONE}
    assert "rollout.retire_s (60s)" in late.retirements[GONE].reason


def test_an_unmanaged_box_retires_once_its_deployments_are_gone() -> None:
    result = retire_step(inp(managed=frozenset()))
    assert result.retirements[GONE].state is RetireState.RETIRING


def test_a_box_placed_again_is_a_new_box() -> None:
    retired = Retirement(GONE, T1, 100.0, RetireState.RETIRED, T0, 100.0, 200.0, "x")
    back = retire_step(inp(target=T2, placed=frozenset({GONE}), retirements={GONE: retired}))
    assert GONE not in back.retirements and back.forget == {GONE}
    draining = replace(retired, state=RetireState.DRAINING)
    stays = retire_step(inp(target=T2, placed=frozenset({GONE}), retirements={GONE: draining}))
    assert GONE not in stays.retirements and not stays.forget  # it never stopped: its release stands


def test_forget_and_the_retiring_document() -> None:
    record = forgotten(GONE, None, T1, 50.0, "admin:abcd")
    assert record.state is RetireState.RETIRED and record.reason == "forgotten by admin:abcd"
    assert retiring_document(GONE, T1, "rk-x") == {"host": GONE, "revision": T1, "servers": [], "report_key": "rk-x"}


def test_the_rollout_releases_a_box_that_left_at_once_and_converges() -> None:
    """The bug of issue 25: a box released a revision that does not place it kept every later rollout
    `running` ("waits: its released revision ... cannot be read or rendered")."""
    release = BoxRelease(GONE, T1, T1, 10.0, BoxState.APPLIED)
    box = BoxInput(GONE, managed=True, target=None, released=None, last_good=None, left=True)
    previous = Rollout(T1, RolloutState.CONVERGED, 1.0, 10.0)
    result = step(StepInput(target=T2, now=20.0, boxes={GONE: box}, releases={GONE: release}, rollout=previous,
                            verdicts={}, routed=frozenset()))
    assert result.rollout.state is RolloutState.CONVERGED
    assert result.releases[GONE].revision == T2 and result.releases[GONE].state is BoxState.APPLIED
    stuck = step(StepInput(target=T2, now=20.0, boxes={GONE: replace(box, left=False)}, releases={GONE: release},
                           rollout=previous, verdicts={}, routed=frozenset()))
    assert stuck.rollout.state is RolloutState.RUNNING  # unreadable (not known to have left): it waits
    assert "cannot be read or rendered" in stuck.status[GONE].why
