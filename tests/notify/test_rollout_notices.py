"""The rollout's notices (rollout_started, converged, rolled_back): derived from the transitions a pass
recorded, news once per revision (no reminder, never resolved), and delivered through the real sender
to a real receiver with the ledger deduplicating them across passes and replicas."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from fleetllm.adapters.notify import Delivery, Notifier
from fleetllm.adapters.state.notifications import MemoryLedger
from fleetllm.adapters.state.passes import PassRecord, RolloutPassRecord
from fleetllm.core.notify import NOTICES, Condition, Event, EventKind, Reason, Target, TargetKind, decide
from fleetllm.core.rollout.transitions import RolloutChange, Transition
from fleetllm.core.secret import Secret
from fleetllm.job.notify import NOTICE_ORDER, notify_pass, rollout_notices
from tests.notify.receiver import receiving

R1, R2, R3 = "1" * 40, "2" * 40, "3" * 40
RENOTIFY = 3600.0
HALT = "box b1: server(s) m crash-loop (the box reports them failed); rolled back to 111111111111"


def record(target: str, state: str, *changes: RolloutChange, rollbacks: dict[str, str] | None = None) -> PassRecord:
    rollout = RolloutPassRecord(target, state, boxes={"b1": "applied", "b2": "waiting"},
                                rollbacks=rollbacks or {}, changes=changes)
    return PassRecord(100.0, 1.0, target, "apply", {}, rollout=rollout)


def change(target: str, transition: Transition, at: float = 160.0, reason: str = "") -> RolloutChange:
    return RolloutChange(target, transition, at, reason, waves=2, started_at=100.0)


def test_each_transition_that_is_a_notice_becomes_one() -> None:
    started, converged = rollout_notices(record(R1, "converged", change(R1, Transition.STARTED, 100.0),
                                                change(R1, Transition.CONVERGED)))
    assert (started.kind, started.subject, started.details["boxes"]) == (EventKind.ROLLOUT_STARTED, R1, 2)
    assert R1[:12] in started.summary and "2 agent-managed boxes" in started.summary
    assert (converged.kind, converged.details["seconds"], converged.details["waves"]) == (EventKind.CONVERGED, 60.0, 2)
    assert "60 s after it started" in converged.summary

    [halted] = rollout_notices(record(R2, "halted", change(R2, Transition.HALTED, reason=HALT), rollbacks={"b1": R1}))
    assert (halted.kind, halted.fingerprint, halted.details["cause"]) == (EventKind.ROLLED_BACK, HALT, "halted")
    assert halted.summary.endswith(HALT) and halted.details["rolled_back"] == {"b1": R1}

    [aborted] = rollout_notices(record(R2, "aborted", change(R2, Transition.ABORTED, reason="aborted by admin:ops"),
                                       rollbacks={"b1": R1, "b2": R1}))
    assert "aborted by admin:ops" in aborted.summary and f"b1 to {R1[:12]}, b2 to {R1[:12]}" in aborted.summary
    [nothing_in_flight] = rollout_notices(record(R2, "aborted", change(R2, Transition.ABORTED, reason="aborted by x")))
    assert "none rolled back" in nothing_in_flight.summary


def test_pauses_resumes_and_supersessions_are_no_notice() -> None:
    assert rollout_notices(record(R2, "running", change(R1, Transition.SUPERSEDED), change(R2, Transition.PAUSED),
                                  change(R2, Transition.RESUMED))) == []
    assert rollout_notices(PassRecord(1.0, 1.0, R1, "apply", {})) == []


def test_a_notice_is_news_once_and_a_changed_one_again() -> None:
    notice = Event(EventKind.CONVERGED, R1, "converged")
    first = decide(None, notice, 100.0, RENOTIFY)
    assert first is not None and first.reason is Reason.NEW and first.after is not None
    assert decide(first.after, notice, 100.0 + 10 * RENOTIFY, RENOTIFY) is None  # never a reminder
    halt = Event(EventKind.ROLLED_BACK, R2, "halted", fingerprint="box a failed")
    opened = Condition(halt.key, str(halt.kind), R2, halt.fingerprint, halt.summary, 1.0, 1.0)
    again = decide(opened, Event(EventKind.ROLLED_BACK, R2, "halted", fingerprint="box b failed"), 2.0, RENOTIFY)
    assert again is not None and again.reason is Reason.CHANGED


def test_a_closed_notice_is_never_sent_as_resolved() -> None:
    target = Target("ops", TargetKind.WEBHOOK, Secret("https://example.invalid/h", "u"), frozenset(EventKind))
    for kind in EventKind:
        opened = Condition(f"{kind}:{R1}", str(kind), R1, "", "x", 1.0, 1.0)
        closed = decide(opened, Event.resolved(kind, R1), 2.0, RENOTIFY)
        assert closed is not None and closed.after is None  # the ledger row goes either way
        assert target.wants(closed, send_resolved=True) is (kind not in NOTICES)


class Recorder:
    def __init__(self) -> None:
        self.settled: list[tuple[EventKind, list[Event], set[str]]] = []

    def settle(self, kind: EventKind, firing: Sequence[Event], among: Collection[str] | None = None,
               keep: Collection[str] = ()) -> None:
        self.settled.append((kind, list(firing), set(keep)))

    def emit(self, event: Event) -> None:
        raise AssertionError("a pass settles")


def test_a_pass_with_transitions_settles_every_notice_kind_keeping_its_rollouts() -> None:
    notifier: Any = Recorder()
    notify_pass(notifier, record(R2, "running", change(R2, Transition.STARTED)))
    notices = {kind: (firing, keep) for kind, firing, keep in notifier.settled if kind in NOTICES}
    assert set(notices) == NOTICES and set(NOTICE_ORDER) == NOTICES
    assert [e.kind for e in notices[EventKind.ROLLOUT_STARTED][0]] == [EventKind.ROLLOUT_STARTED]
    assert notices[EventKind.CONVERGED] == ([], {R2}) and notices[EventKind.ROLLED_BACK] == ([], {R2})
    quiet: Any = Recorder()
    notify_pass(quiet, record(R2, "running"))  # no transition: the ledger is not asked about notices
    assert not [kind for kind, _, _ in quiet.settled if kind in NOTICES]


def test_notices_reach_a_receiver_once_each_across_passes_and_replicas() -> None:
    """Two replicas sharing one ledger run the passes of a bad commit, its revert and a repeat of each
    pass (a record read again): the receiver gets each notice once, and no resolved notice."""
    with receiving() as receiver:
        target = Target("ops", TargetKind.WEBHOOK, Secret(receiver.url + "/hook", "the url"), NOTICES)
        ledger = MemoryLedger()
        delivery = Delivery(renotify_s=0.0, timeout_s=5.0, attempts=2, queue_size=100, send_resolved=True)
        replicas = [Notifier([target], delivery, ledger, component="reconciler", instance=f"r{i}") for i in (1, 2)]
        passes = [
            record(R1, "converged", change(R1, Transition.STARTED, 100.0), change(R1, Transition.CONVERGED)),
            record(R2, "running", change(R2, Transition.STARTED)),
            record(R2, "halted", change(R2, Transition.HALTED, reason=HALT), rollbacks={"b1": R1}),
            record(R3, "running", change(R3, Transition.STARTED)),
            record(R3, "converged", change(R3, Transition.CONVERGED)),
        ]
        for one in passes:
            for replica in (*replicas, replicas[0]):
                notify_pass(replica, one)
                assert replica.drain(10)
        receiver.wait_for(6)
        assert all(replica.close(5) for replica in replicas)
        sent = [(r.body["kind"], r.body["subject"], r.body["status"], r.body["severity"]) for r in receiver.received]
    # (a target's deliveries run side by side: two notices of one pass may arrive in either order)
    assert sorted(sent) == sorted([("rollout_started", R1, "firing", "info"), ("converged", R1, "firing", "info"),
                                   ("rollout_started", R2, "firing", "info"), ("rolled_back", R2, "firing", "warning"),
                                   ("rollout_started", R3, "firing", "info"), ("converged", R3, "firing", "info")])
    assert {c.subject for kind in NOTICES for c in ledger.open_conditions(str(kind)).values()} == {R3}
