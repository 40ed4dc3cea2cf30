"""A halted rollout is notified from the pass that records it, and resolved when the rollout is no
longer halted (a new commit starts a new one, or a person resumes it)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from fleetllm.adapters.state.passes import PassRecord, RolloutPassRecord
from fleetllm.core.notify import Event, EventKind
from fleetllm.job.notify import notify_pass, rollout_event

TARGET = "a" * 40


def record(state: str, halt: str = "") -> PassRecord:
    rollout = RolloutPassRecord(TARGET, state, reason="box-1: fleetllm-m crash loop", waves=1,
                                rollbacks={"box-1": "b" * 40} if halt else {}, halt=halt)
    return PassRecord(0.0, 1.0, TARGET, "apply", {}, rollout=rollout)


class Recorder:
    def __init__(self) -> None:
        self.settled: list[tuple[EventKind, list[Event]]] = []

    def settle(self, kind: EventKind, firing: Sequence[Event], among: Collection[str] | None = None,
               keep: Collection[str] = ()) -> None:
        self.settled.append((kind, list(firing)))

    def emit(self, event: Event) -> None:
        raise AssertionError("a pass settles its conditions")


def test_a_halted_rollout_is_one_event_naming_the_target_the_reason_and_the_rollback() -> None:
    event = rollout_event(record("halted", halt="box-1: fleetllm-m crash loop"))
    assert event is not None
    assert (event.kind, event.subject, event.firing) == (EventKind.ROLLOUT_HALTED, TARGET, True)
    assert "crash loop" in event.summary and TARGET[:12] in event.summary
    assert event.details["rolled_back"] == {"box-1": "b" * 40}
    assert event.details["reason"] == "box-1: fleetllm-m crash loop"


def test_a_rollout_that_is_not_halted_is_no_event() -> None:
    for state in ("running", "paused", "converged", "aborted"):
        assert rollout_event(record(state)) is None


def test_each_pass_settles_the_rollout_condition() -> None:
    notifier: Any = Recorder()
    notify_pass(notifier, record("halted", halt="box-1 failed"))
    notify_pass(notifier, record("running"))
    rollout = [(kind, firing) for kind, firing in notifier.settled if kind is EventKind.ROLLOUT_HALTED]
    assert [len(firing) for _, firing in rollout] == [1, 0]  # firing, then resolved by the next pass


def test_a_pass_without_a_rollout_leaves_the_condition_alone() -> None:
    notifier: Any = Recorder()
    notify_pass(notifier, PassRecord(0.0, 1.0, TARGET, "apply", {}))
    assert all(kind is not EventKind.ROLLOUT_HALTED for kind, _ in notifier.settled)
