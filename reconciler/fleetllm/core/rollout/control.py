"""Pause, resume and abort: what a person's request does to a rollout. Pure."""

from __future__ import annotations

from dataclasses import replace
from enum import StrEnum

from fleetllm.core.rollout.model import Rollout, RolloutState


class Request(StrEnum):
    PAUSE = "pause"
    RESUME = "resume"
    ABORT = "abort"


FINISHED = frozenset({RolloutState.CONVERGED, RolloutState.ABORTED})


def refusal(rollout: Rollout | None, request: Request) -> str | None:
    """Why the request cannot apply to the rollout (None: it can)."""
    if rollout is None:
        return "there is no rollout yet: the reconciler starts one at its first pass"
    if rollout.state in FINISHED:
        return f"the rollout of {rollout.target[:12]} is {rollout.state}: a new commit starts a new one"
    if request is Request.PAUSE and rollout.state is not RolloutState.RUNNING:
        return f"the rollout is {rollout.state}, not running"
    if request is Request.RESUME and rollout.state is RolloutState.RUNNING:
        return "the rollout is already running"
    return None


def apply_request(rollout: Rollout, request: Request, actor: str, now: float) -> Rollout:
    """The rollout once the request applies (refusal() first: a refused request changes nothing)."""
    if refusal(rollout, request) is not None:
        return rollout
    if request is Request.PAUSE:
        return replace(rollout, state=RolloutState.PAUSED, reason=f"paused by {actor}", updated_at=now)
    if request is Request.RESUME:
        return replace(rollout, state=RolloutState.RUNNING, reason="", updated_at=now)
    return replace(rollout, state=RolloutState.ABORTED, reason=f"aborted by {actor}", updated_at=now)
