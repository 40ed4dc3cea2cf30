"""Operator controls of the whole fleet, without a commit (issue 18): sync now, suspend/resume, pin.

Pure data and the rules over it; the state store keeps them (fleetllm.adapters.state.control), the
control plane sets them (POST /admin/sync|suspend|resume|pin|unpin, the status pages' buttons, the CLI),
the reconcile loop and the control plane read them.

- A sync request asks the reconcile loop for a pass now; the first loop to take it runs one.
- A suspension: passes still observe and record verdicts, but act on nothing (no LiteLLM writes, no
  deletes) until resumed.
- A pin: every box is served the pinned revision, and the reconciler's intended state is that
  revision, until unpinned. `chosen_revision` is the one place that says which revision wins.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

MAX_REASON_CHARS = 500  # an operator's words, kept with the action


class ControlAction(StrEnum):
    SYNC = "sync"
    SUSPEND = "suspend"
    RESUME = "resume"
    PIN = "pin"
    UNPIN = "unpin"
    # a person's request to the staged rollout (fleetllm.core.rollout.control), kept in the same trail
    ROLLOUT_PAUSE = "rollout-pause"
    ROLLOUT_RESUME = "rollout-resume"
    ROLLOUT_ABORT = "rollout-abort"
    ROLLOUT_FORGET = "rollout-forget"  # a box that left the placement, retired at once (core.rollout.retire)


@dataclass(frozen=True)
class Suspension:
    actor: str  # who: "<role>:<token fingerprint>", "token:<name>" or "<subject> <email>"; never a token
    at: float  # unix time
    reason: str


@dataclass(frozen=True)
class Pin:
    revision: str  # a full commit id of the tracked branch's history that validated when pinned
    actor: str
    at: float
    reason: str


@dataclass(frozen=True)
class SyncRequest:
    actor: str
    at: float
    reason: str


@dataclass(frozen=True)
class ControlState:
    """What is in force now."""

    suspended: Suspension | None = None
    pin: Pin | None = None
    sync: SyncRequest | None = None  # a pass asked for and not yet taken by a reconcile loop


NOTHING = ControlState()


@dataclass(frozen=True)
class ControlEvent:
    """One line of the audit trail: who did what, when and why."""

    at: float
    action: ControlAction
    actor: str
    reason: str
    revision: str | None = None  # the pinned revision, for a pin; the rollout's target, for a rollout request


def clean_reason(text: object) -> str:
    """An operator's reason as kept: a string, control characters replaced, at most MAX_REASON_CHARS."""
    if not isinstance(text, str):
        return ""
    flat = "".join(c if c.isprintable() else " " for c in text).strip()
    return flat[:MAX_REASON_CHARS]


def chosen_revision(newest_valid: str | None, pin: Pin | None) -> str | None:
    """The revision the fleet runs: the pinned one while a pin is in force, else the newest valid
    commit of the tracked branch. (A rollout's target is this revision.)"""
    return pin.revision if pin is not None else newest_valid
