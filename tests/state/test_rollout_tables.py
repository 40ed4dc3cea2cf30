"""The rollout tables (migration 5) on both engines: durable across a reopen, one row per target, a
person's request kept until the pass that takes it."""

from __future__ import annotations

from fleetllm.adapters.state import open_store
from fleetllm.adapters.state.sqlstore import SqlStateStore
from fleetllm.core.rollout.control import Request
from fleetllm.core.rollout.model import BoxRelease, BoxState, Rollout, RolloutState

R1 = Rollout("a" * 40, RolloutState.RUNNING, 100.0, 100.0)
REL = {"box1": BoxRelease("box1", "a" * 40, "b" * 40, 101.5, BoxState.DRAINING, drain_started_at=101.5, wave=2,
                          reason="draining"),
       "box2": BoxRelease("box2", "b" * 40, "b" * 40, 90.0, BoxState.WAITING)}


def test_nothing_before_the_first_pass(store: SqlStateStore) -> None:
    assert store.current_rollout() == (None, None, None)
    assert store.box_releases() == {} and store.recent_rollouts() == []
    assert store.request_rollout(Request.PAUSE, "alice") is None


def test_a_step_is_saved_and_read_back_after_a_reopen(store: SqlStateStore, store_url: str) -> None:
    store.save_rollout(R1, REL)
    store.close()
    again = open_store(store_url)
    try:
        assert again.current_rollout() == (R1, None, None)
        assert again.box_releases() == REL
    finally:
        again.close()


def test_the_same_target_updates_its_row_a_new_target_starts_one(store: SqlStateStore) -> None:
    store.save_rollout(R1, REL)
    halted = Rollout(R1.target, RolloutState.HALTED, 100.0, 130.0, reason="box1: crash loop", waves=3)
    store.save_rollout(halted, {"box1": REL["box1"]})
    assert store.recent_rollouts() == [halted]
    assert set(store.box_releases()) == {"box1"}  # a box that left the rollout is forgotten
    fix = Rollout("c" * 40, RolloutState.RUNNING, 140.0, 140.0)
    store.save_rollout(fix, REL)
    assert store.recent_rollouts() == [fix, halted]
    assert store.current_rollout()[0] == fix


def test_a_request_waits_for_the_pass_that_takes_it(store: SqlStateStore) -> None:
    store.save_rollout(R1, REL)
    assert store.request_rollout(Request.PAUSE, "alice") == R1
    assert store.current_rollout() == (R1, Request.PAUSE, "alice")
    # A pass that took an older request does not clear a newer one.
    store.request_rollout(Request.ABORT, "bob")
    store.save_rollout(R1, REL, taken=Request.PAUSE)
    assert store.current_rollout() == (R1, Request.ABORT, "bob")
    store.save_rollout(R1, REL, taken=Request.ABORT)
    assert store.current_rollout() == (R1, None, None)


def test_rollout_rows_are_bounded(store: SqlStateStore, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import fleetllm.adapters.state.sqlstore as sqlstore

    monkeypatch.setattr(sqlstore, "KEEP_ROLLOUTS", 3)
    for i in range(6):
        store.save_rollout(Rollout(f"{i:040d}", RolloutState.CONVERGED, float(i), float(i)), {})
    assert [r.target for r in store.recent_rollouts()] == [f"{i:040d}" for i in (5, 4, 3)]


def test_retirements_are_saved_with_the_releases_and_never_turned_back_from_retired(store: SqlStateStore,
                                                                                    store_url: str) -> None:
    """Migration 8 (issue 25): a pass writes the retirements it changed in the releases' transaction; a record
    `rollout forget` retired meanwhile is not turned back by a pass that began before it; a box placed again
    loses its record."""
    from fleetllm.core.control import ControlAction
    from fleetllm.core.rollout.retire import Retirement, RetireState

    retiring = Retirement("box1", "c" * 40, 200.0, RetireState.RETIRING, "a" * 40, retiring_at=210.0)
    store.save_rollout(R1, REL, retirements={"box1": retiring})
    assert store.retirements() == {"box1": retiring}
    forgotten = Retirement("box1", "c" * 40, 200.0, RetireState.RETIRED, "a" * 40, 210.0, 220.0, "forgotten by bob")
    store.forget_box(forgotten, "bob", 220.0)
    assert "box1" not in store.box_releases() and store.retirements() == {"box1": forgotten}
    audit = store.control_audit(1)[0]
    assert (audit.action, audit.actor, audit.revision) == (ControlAction.ROLLOUT_FORGET, "bob", "c" * 40)
    store.save_rollout(R1, REL, retirements={"box1": retiring})  # a pass that read it before the forget
    assert store.retirements() == {"box1": forgotten}
    store.close()
    again = open_store(store_url)
    try:
        assert again.retirements() == {"box1": forgotten}
        again.save_rollout(R1, REL, placed_again=frozenset({"box1"}))
        assert again.retirements() == {}
    finally:
        again.close()
