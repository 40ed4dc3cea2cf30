"""Pause, resume and abort: which requests a rollout's state allows, and what they make of it."""

from __future__ import annotations

import pytest

from fleetllm.core.rollout.control import Request, apply_request, refusal
from fleetllm.core.rollout.model import Rollout, RolloutState

RUNNING = Rollout("a" * 40, RolloutState.RUNNING, 1.0, 2.0, reason="", waves=2)


def at(state: RolloutState) -> Rollout:
    return Rollout(RUNNING.target, state, 1.0, 2.0, reason="why", waves=2)


def test_nothing_to_control_before_the_first_rollout() -> None:
    assert refusal(None, Request.PAUSE) == "there is no rollout yet: the reconciler starts one at its first pass"


@pytest.mark.parametrize("state", [RolloutState.CONVERGED, RolloutState.ABORTED])
def test_a_finished_rollout_takes_no_request(state: RolloutState) -> None:
    for request in Request:
        assert refusal(at(state), request) == (f"the rollout of aaaaaaaaaaaa is {state}: a new commit starts a new "
                                               "one")
        assert apply_request(at(state), request, "admin:x", 9.0) == at(state)


def test_pause_only_a_running_rollout_and_resume_only_a_stopped_one() -> None:
    assert refusal(RUNNING, Request.PAUSE) is None
    assert refusal(at(RolloutState.PAUSED), Request.PAUSE) == "the rollout is paused, not running"
    assert refusal(at(RolloutState.HALTED), Request.PAUSE) == "the rollout is halted, not running"
    assert refusal(RUNNING, Request.RESUME) == "the rollout is already running"
    assert refusal(at(RolloutState.PAUSED), Request.RESUME) is None
    assert refusal(at(RolloutState.HALTED), Request.RESUME) is None
    assert refusal(RUNNING, Request.ABORT) is None and refusal(at(RolloutState.HALTED), Request.ABORT) is None


def test_what_each_request_makes_of_the_rollout() -> None:
    paused = apply_request(RUNNING, Request.PAUSE, "admin:x", 9.0)
    assert (paused.state, paused.reason, paused.updated_at, paused.waves) == (RolloutState.PAUSED,
                                                                             "paused by admin:x", 9.0, 2)
    resumed = apply_request(at(RolloutState.HALTED), Request.RESUME, "admin:y", 10.0)
    assert (resumed.state, resumed.reason, resumed.updated_at) == (RolloutState.RUNNING, "", 10.0)
    aborted = apply_request(RUNNING, Request.ABORT, "admin:z", 11.0)
    assert (aborted.state, aborted.reason, aborted.updated_at) == (RolloutState.ABORTED, "aborted by admin:z", 11.0)
    assert apply_request(RUNNING, Request.RESUME, "admin:x", 12.0) == RUNNING  # refused: unchanged
