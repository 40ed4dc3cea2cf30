"""The rollout's transitions (fleetllm.core.rollout.transitions): what the job announces from the rollout a
pass found and the one it recorded, state pair by state pair and along simulated rollouts."""

from __future__ import annotations

from dataclasses import replace

import pytest

from fleetllm.core.rollout.model import Rollout, RolloutState, Step
from fleetllm.core.rollout.transitions import RolloutChange, Transition, pass_transitions, transitions
from tests.rollout.sim import Sim

R1, R2 = "1" * 40, "2" * 40
S = RolloutState
T = Transition


def rollout(target: str, state: RolloutState, reason: str = "", at: float = 20.0) -> Rollout:
    return Rollout(target, state, started_at=10.0, updated_at=at, reason=reason, waves=1)


def kinds(changes: tuple[RolloutChange, ...]) -> list[tuple[str, Transition]]:
    return [(c.target, c.transition) for c in changes]


def test_the_first_rollout_starts() -> None:
    assert kinds(transitions(None, rollout(R1, S.RUNNING))) == [(R1, T.STARTED)]
    started = transitions(None, rollout(R1, S.RUNNING))[0]
    assert started.at == 10.0  # when it started, not when it was last updated


def test_a_fleet_without_agent_boxes_starts_and_converges_in_one_pass() -> None:
    assert kinds(transitions(None, rollout(R1, S.CONVERGED))) == [(R1, T.STARTED), (R1, T.CONVERGED)]


@pytest.mark.parametrize("state", [S.RUNNING, S.PAUSED])
def test_a_new_target_supersedes_an_unfinished_rollout(state: RolloutState) -> None:
    changes = transitions(rollout(R1, state), rollout(R2, S.RUNNING, at=30.0))
    assert kinds(changes) == [(R1, T.SUPERSEDED), (R2, T.STARTED)]
    assert changes[0].by == R2 and R2[:12] in changes[0].reason and changes[0].at == 30.0
    assert changes[0].final


@pytest.mark.parametrize("state", [S.CONVERGED, S.HALTED, S.ABORTED])
def test_a_new_target_leaves_a_finished_rollout_its_outcome(state: RolloutState) -> None:
    assert kinds(transitions(rollout(R1, state), rollout(R2, S.RUNNING))) == [(R2, T.STARTED)]


@pytest.mark.parametrize(("before", "after", "expected"), [
    (S.RUNNING, S.RUNNING, []),
    (S.RUNNING, S.PAUSED, [T.PAUSED]),
    (S.RUNNING, S.CONVERGED, [T.CONVERGED]),
    (S.RUNNING, S.HALTED, [T.HALTED]),
    (S.RUNNING, S.ABORTED, [T.ABORTED]),
    (S.PAUSED, S.RUNNING, [T.RESUMED]),
    (S.PAUSED, S.ABORTED, [T.ABORTED]),
    (S.HALTED, S.RUNNING, [T.RESUMED]),
    (S.HALTED, S.HALTED, []),
    (S.HALTED, S.ABORTED, [T.ABORTED]),
    (S.CONVERGED, S.RUNNING, []),  # a box took the agent after it converged: it converges again
    (S.CONVERGED, S.CONVERGED, []),
])
def test_the_same_target_changing_state(before: RolloutState, after: RolloutState,
                                        expected: list[Transition]) -> None:
    changes = transitions(rollout(R1, before), rollout(R1, after, reason="why", at=40.0))
    assert [c.transition for c in changes] == expected
    assert all(c.target == R1 and c.at == 40.0 and c.reason == "why" for c in changes)


def test_a_pass_that_resumes_a_halted_rollout_which_halts_again_says_both() -> None:
    stored = rollout(R1, S.HALTED, "box a: crash-loop")
    resumed = replace(stored, state=S.RUNNING, reason="")
    halted = rollout(R1, S.HALTED, "box b: crash-loop", at=50.0)
    assert [c.transition for c in pass_transitions(stored, resumed, halted)] == [T.RESUMED, T.HALTED]
    assert pass_transitions(stored, resumed, halted)[-1].reason == "box b: crash-loop"


def test_a_pass_without_a_request_compares_the_stored_rollout_with_the_recorded_one() -> None:
    assert pass_transitions(None, None, rollout(R1, S.RUNNING)) == transitions(None, rollout(R1, S.RUNNING))
    stored = rollout(R1, S.RUNNING)
    assert pass_transitions(stored, stored, stored) == ()
    assert kinds(pass_transitions(stored, stored, rollout(R1, S.CONVERGED))) == [(R1, T.CONVERGED)]


def test_an_abort_is_said_once_though_it_is_taken_before_the_step() -> None:
    stored = rollout(R1, S.RUNNING)
    aborted = replace(stored, state=S.ABORTED, reason="aborted by admin:x")
    changes = pass_transitions(stored, aborted, replace(aborted, updated_at=60.0))
    assert [c.transition for c in changes] == [T.ABORTED] and changes[0].reason == "aborted by admin:x"


class Recorded(Sim):
    """The simulator, with every pass's transitions as the job computes them (stored, requested, recorded)."""

    def one_pass(self) -> Step:
        stored, control = self.rollout, self.control
        requested = (Rollout(stored.target, control, stored.started_at, stored.updated_at, "", stored.waves)
                     if stored is not None and control is not None else stored)
        result = super().one_pass()
        self.said.extend(kinds(pass_transitions(stored, requested, result.rollout)))
        return result

    @property
    def said(self) -> list[tuple[str, Transition]]:
        if "_said" not in self.__dict__:
            self.__dict__["_said"] = []
        said: list[tuple[str, Transition]] = self.__dict__["_said"]
        return said


def test_along_a_bad_boot_change_and_its_revert_each_rollout_starts_once_and_ends_once() -> None:
    layout = {f"box{i}": [("m", 8001), (f"n{i}", 8002)] for i in range(4)}
    recipes = {"m": "v1", **{f"n{i}": "v1" for i in range(4)}}
    sim = Recorded.start("r1", layout, recipes, bad_digests=frozenset({"m:bad:8001"}))
    sim.run(2)
    sim.commit("r2", layout, {**recipes, "m": "bad"})
    sim.run()
    for _ in range(3):  # halted: passes go on quietly
        sim.one_pass()
    sim.commit("r3", layout, recipes)
    sim.run()
    assert sim.said == [("r1", T.STARTED), ("r1", T.CONVERGED), ("r2", T.STARTED), ("r2", T.HALTED),
                        ("r3", T.STARTED), ("r3", T.CONVERGED)]


def test_along_pause_resume_abort_and_a_superseding_commit() -> None:
    layout = {f"box{i}": [("m", 8001)] for i in range(3)}
    sim = Recorded.start("r1", layout, {"m": "v1"})
    sim.run(2)
    sim.commit("r2", layout, {"m": "v2"})
    sim.one_pass()
    sim.control = RolloutState.PAUSED
    sim.one_pass()
    sim.control = RolloutState.RUNNING
    sim.one_pass()
    sim.commit("r3", layout, {"m": "v3"})  # r2 has not finished
    sim.one_pass()
    sim.control = RolloutState.ABORTED
    sim.one_pass()
    sim.one_pass()
    assert sim.said == [("r1", T.STARTED), ("r1", T.CONVERGED), ("r2", T.STARTED), ("r2", T.PAUSED),
                        ("r2", T.RESUMED), ("r2", T.SUPERSEDED), ("r3", T.STARTED), ("r3", T.ABORTED)]
