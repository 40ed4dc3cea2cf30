"""What happened to a revision's rollout between two of its states: the transitions the reconcile job
announces (notifications, the fleet repository's commit statuses). Pure.

`transitions(before, after)` compares two states of the newest rollout: the one a pass found (or None:
there was none) and the one it recorded. A pass calls it twice, as a pass moves the rollout twice: from
the stored state to the state once a person's request applies (paused, resumed, aborted), and from there
to the state the step leaves (a new target started, a box failed, every box converged).

- a new target: the rollout it replaces is `superseded` when it had not finished (running or paused;
  a converged, halted or aborted one keeps its outcome), then the new one `started`, then whatever state
  it is already in (a fleet without agent-managed boxes converges in its first pass);
- the same target: `paused`, `resumed` (running again after a pause or a halt), `converged`, `halted`
  or `aborted` when its state became that. A converged rollout that runs again (a box took the agent
  after it converged) is no transition: it converges again, which is one (`converged`, again).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from fleetllm.core.rollout.model import Rollout, RolloutState


class Transition(StrEnum):
    STARTED = "started"  # a rollout of a new target began
    PAUSED = "paused"  # a person paused it: no box is released until it is resumed
    RESUMED = "resumed"  # running again after a pause or a halt
    CONVERGED = "converged"  # every agent-managed box runs the target
    HALTED = "halted"  # a released box failed and was rolled back to its last good revision
    ABORTED = "aborted"  # a person aborted it: released but unconverged boxes were rolled back
    SUPERSEDED = "superseded"  # a newer target started before it finished


# The state a rollout enters, as the transition that says so (RUNNING is `resumed` only after a stop).
ENTERED = {
    RolloutState.PAUSED: Transition.PAUSED,
    RolloutState.CONVERGED: Transition.CONVERGED,
    RolloutState.HALTED: Transition.HALTED,
    RolloutState.ABORTED: Transition.ABORTED,
}
STOPPED = frozenset({RolloutState.PAUSED, RolloutState.HALTED})  # running again after these is `resumed`
UNFINISHED = frozenset({RolloutState.RUNNING, RolloutState.PAUSED})  # replaced before its end: superseded
FINAL = frozenset({Transition.CONVERGED, Transition.HALTED, Transition.ABORTED, Transition.SUPERSEDED})


@dataclass(frozen=True)
class RolloutChange:
    """One transition of the rollout of `target`. `reason`: why it halted, who paused or aborted it;
    `by`: the target that superseded it; `at`: when (the rollout's updated_at); `started_at`: when the
    rollout of `target` started."""

    target: str
    transition: Transition
    at: float
    reason: str = ""
    waves: int = 0
    by: str = ""
    started_at: float = 0.0

    @property
    def final(self) -> bool:
        """The rollout of `target` ended (until a person resumes a halted one)."""
        return self.transition in FINAL


def transitions(before: Rollout | None, after: Rollout) -> tuple[RolloutChange, ...]:
    """The transitions from `before` (None: no rollout yet) to `after`, in the order they happened."""
    changes: list[RolloutChange] = []
    if before is None or before.target != after.target:
        if before is not None and before.state in UNFINISHED:
            changes.append(RolloutChange(before.target, Transition.SUPERSEDED, after.updated_at,
                                         f"superseded by {after.target[:12]} before it finished", before.waves,
                                         by=after.target, started_at=before.started_at))
        changes.append(RolloutChange(after.target, Transition.STARTED, after.started_at, waves=after.waves,
                                     started_at=after.started_at))
        entered = ENTERED.get(after.state)
    elif before.state is after.state:
        entered = None
    elif after.state is RolloutState.RUNNING:
        entered = Transition.RESUMED if before.state in STOPPED else None
    else:
        entered = ENTERED.get(after.state)
    if entered is not None:
        changes.append(RolloutChange(after.target, entered, after.updated_at, after.reason, after.waves,
                                     started_at=after.started_at))
    return tuple(changes)


def pass_transitions(stored: Rollout | None, requested: Rollout | None, after: Rollout) -> tuple[RolloutChange, ...]:
    """A pass's transitions: from the stored rollout to the one a person's request made of it
    (`requested`; the stored one when there was no request), then to the one the step recorded."""
    first = transitions(stored, requested) if requested is not None else ()
    return (*first, *transitions(requested if requested is not None else stored, after))


__all__ = ["RolloutChange", "Transition", "pass_transitions", "transitions"]
