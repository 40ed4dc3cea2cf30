"""What the control plane notifies (fleetllm.core.notify): a new invalid head of the tracked branch
(from the revision tracker, resolved when the head is valid again), and an overdue reconcile pass
(checked after each refresh of the branch, resolved by the next pass recorded in time).

Every replica notices the same head and the same late pass; the state store's ledger makes one of
them the sender.
"""

from __future__ import annotations

from fleetllm.adapters.notify import Notifier
from fleetllm.adapters.state.store import PassLog
from fleetllm.core.notify import Event, EventKind
from fleetllm.core.schedule import overdue_after

MAX_ERRORS = 10
OVERDUE = "overdue"


def notify_head(notifier: Notifier, branch: str, head: str, errors: tuple[str, ...] | None,
                served: str | None) -> None:
    """The branch head was examined: `errors` None when it is valid, else why it is not."""
    if errors is None:
        notifier.settle(EventKind.INVALID_COMMIT, [], among=(branch,))
        return
    keeping = f"; boxes keep {served[:12]}" if served else "; no valid revision is served"
    first = f": {errors[0]}" if errors else ""
    notifier.settle(EventKind.INVALID_COMMIT, [Event(
        EventKind.INVALID_COMMIT, branch, f"commit {head[:12]} at the head of {branch} is invalid{first}{keeping}",
        fingerprint=head, details={"branch": branch, "revision": head, "served_revision": served,
                                   "error_count": len(errors), "errors": list(errors[:MAX_ERRORS])})],
        among=(branch,))


def overdue_event(last_started: float | None, since: float, now: float, interval_s: float) -> Event | None:
    """pass_failed (overdue) when the last pass started too long ago (or none since `since`, this
    control plane's start), by the served fleet's reconcile.interval_s."""
    late = now - (last_started if last_started is not None else since)
    if late <= overdue_after(interval_s):
        return None
    what = (f"the last reconcile pass started {int(late)} s ago" if last_started is not None
            else f"no reconcile pass recorded in the {int(late)} s since this control plane started")
    return Event(EventKind.PASS_FAILED, OVERDUE,
                 f"{what}; passes are due every {interval_s:g} s: is `fleetllm reconcile` running?",
                 details={"last_pass_started_at": last_started, "late_s": int(late), "interval_s": interval_s})


def watch_passes(notifier: Notifier, passes: PassLog, *, expected: bool, interval_s: float, since: float,
                 now: float) -> None:
    """Check for an overdue pass (when a reconciler is expected: reconcile.enabled and a litellm section)."""
    if not notifier.enabled:
        return
    event = None
    if expected:
        last = passes.recent_passes(1)
        event = overdue_event(last[0].started_at if last else None, since, now, interval_s)
    notifier.settle(EventKind.PASS_FAILED, [event] if event else [], among=(OVERDUE,))
