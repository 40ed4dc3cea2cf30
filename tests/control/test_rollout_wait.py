"""Waiting for a rollout (fleetllm.cli.waiting): what one view of the admin API's rollouts says about the
revision waited for, and the polling around it (exit 0 converged, 1 halted, aborted or superseded, 2 at
the timeout), with a stand-in for the admin client and a fake clock. The same against a real control
plane process: tests/server/test_rollout_process.py and tests/control/test_controls_real.py."""

from __future__ import annotations

from typing import Any

import pytest

from fleetllm.adapters.admin_client import AdminApiError, AdminClient, AdminRefused
from fleetllm.cli.common import CommandError
from fleetllm.cli.waiting import judge, revision_argument, wait_for_rollout
from fleetllm.core.secret import Secret

R1, R2 = "1a" * 20, "2b" * 20


def rollout(target: str, state: str, reason: str = "", boxes: dict[str, str] | None = None) -> dict[str, Any]:
    return {"target": target, "state": state, "reason": reason, "waves": 1, "started_at": 1.0, "updated_at": 2.0,
            "requested": None, "boxes": {b: {"state": s} for b, s in (boxes or {}).items()}}


def view(current: dict[str, Any] | None, *older: dict[str, Any]) -> dict[str, Any]:
    history = [current, *older] if current is not None else list(older)
    return {"rollout": current, "history": [{k: r[k] for k in ("target", "state", "reason", "waves", "started_at",
                                                               "updated_at")} for r in history]}


def test_the_current_rollout_of_the_revision() -> None:
    going = judge(view(rollout(R1, "running", boxes={"a": "applied", "b": "waiting", "c": "released"})), R1[:7])
    assert going.code is None and going.target == R1
    assert going.line == f"rollout of {R1[:12]}: running, 1 wave(s); boxes: 1 applied, 1 released, 1 waiting"
    assert judge(view(rollout(R1, "paused", "paused by admin:x")), R1).line.endswith("(paused by admin:x)")
    assert judge(view(rollout(R1, "converged")), R1).code == 0
    halted = judge(view(rollout(R1, "halted", "box a: crash-loop; rolled back to 2b2b")), R1)
    assert (halted.code, halted.line) == (1, "halted: box a: crash-loop; rolled back to 2b2b")
    assert judge(view(rollout(R1, "aborted", "aborted by admin:x")), R1).code == 1


def test_without_a_revision_the_current_rollout_is_the_one() -> None:
    assert judge(view(None), None).code is None and "no rollout yet" in judge(view(None), None).line
    assert judge(view(rollout(R2, "converged")), None) == judge(view(rollout(R2, "converged")), R2)


def test_a_revision_not_yet_rolled_out_is_waited_for() -> None:
    pending = judge(view(rollout(R1, "converged")), R2)
    assert pending.code is None and pending.target is None
    assert f"rollout of {R2[:12]} has not started (the newest is {R1[:12]}, converged)" in pending.line


def test_an_older_rollout_keeps_its_outcome_and_an_unfinished_one_was_superseded() -> None:
    assert judge(view(rollout(R2, "running"), rollout(R1, "converged")), R1).code == 0
    assert judge(view(rollout(R2, "running"), rollout(R1, "halted", "box a failed")), R1).line == "halted: box a failed"
    superseded = judge(view(rollout(R2, "running"), rollout(R1, "running")), R1)
    assert superseded.code == 1 and superseded.line.startswith("superseded") and R2[:12] in superseded.line


@pytest.mark.parametrize("text", ["main", "HEAD~1", "12", "z" * 40, "a" * 41])
def test_a_revision_is_a_commit_id(text: str) -> None:
    with pytest.raises(CommandError) as caught:
        revision_argument(text, "REVISION")
    assert caught.value.exit_code == 2 and repr(text) in str(caught.value)
    assert revision_argument(" ABCDEF0 ", "REVISION") == "abcdef0"


class Views(AdminClient):
    """Answers GET /admin/rollout with the next of `answers` (an exception is raised), then the last again."""

    def __init__(self, answers: list[Any]) -> None:
        super().__init__("http://127.0.0.1:9", Secret("t", "t"))
        object.__setattr__(self, "answers", answers)
        object.__setattr__(self, "asked", [])

    def with_timeout(self, timeout_s: float) -> AdminClient:
        self.asked.append(timeout_s)  # type: ignore[attr-defined]
        return self

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        assert (method, path) == ("GET", "/admin/rollout")
        answers: list[Any] = self.answers  # type: ignore[attr-defined]
        answer = answers.pop(0) if len(answers) > 1 else answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def waited(answers: list[Any], revision: str | None = R1, timeout_s: float = 60.0) -> tuple[int, list[str]]:
    said: list[str] = []
    clock = Clock()
    code = wait_for_rollout(Views(answers), revision, timeout_s=timeout_s, interval_s=5.0, say=said.append,
                            clock=clock, sleep=clock.sleep)
    return code, said


def test_progress_is_printed_when_it_changes_until_the_end() -> None:
    running = view(rollout(R1, "running", boxes={"a": "released", "b": "waiting"}))
    code, said = waited([view(rollout(R2, "converged")), running, running,
                         AdminApiError("GET /admin/rollout: cannot reach the control plane: refused"),
                         view(rollout(R1, "running", boxes={"a": "applied", "b": "released"})),
                         view(rollout(R1, "converged"))])
    assert code == 0
    assert [line.split("] ", 1)[1] for line in said] == [
        f"the rollout of {R1[:12]} has not started (the newest is {R2[:12]}, converged): the reconciler starts it "
        "once it reads the commit (a sync, a push webhook, or its next interval)",
        f"rollout of {R1[:12]}: running, 1 wave(s); boxes: 1 released, 1 waiting",
        "the control plane cannot be asked (GET /admin/rollout: cannot reach the control plane: refused); asking again",
        f"rollout of {R1[:12]}: running, 1 wave(s); boxes: 1 applied, 1 released",
        f"converged: every agent-managed box runs {R1[:12]}"]
    assert said[0].startswith("[    0s]") and said[-1].startswith("[   25s]")


def test_a_halt_is_1_and_the_timeout_is_2() -> None:
    code, said = waited([view(rollout(R1, "running")), view(rollout(R1, "halted", "box a: install failed"))])
    assert code == 1 and said[-1].endswith("halted: box a: install failed")
    code, said = waited([view(rollout(R1, "running"))], timeout_s=12.0)
    assert code == 2 and said[-1].startswith(f"timed out after 12 s: the rollout of {R1[:12]} has not ended")
    assert len(said) == 2  # the one progress line, then the timeout: nothing repeated


def test_the_current_rollout_is_fixed_at_the_first_look() -> None:
    """Without a revision, a newer commit starting meanwhile does not change what is waited for."""
    code, said = waited([view(rollout(R1, "running")), view(rollout(R2, "running"), rollout(R1, "running"))], None)
    assert code == 1 and "superseded" in said[-1]


def test_a_refused_token_ends_the_wait_at_once() -> None:
    with pytest.raises(CommandError) as caught:
        waited([AdminRefused("GET /admin/rollout: HTTP 401: no valid token", 401)])
    assert caught.value.exit_code == 2 and "HTTP 401" in str(caught.value)


def test_each_request_gets_at_most_what_is_left() -> None:
    views = Views([view(rollout(R1, "running"))])
    clock = Clock()
    wait_for_rollout(views, R1, timeout_s=22.0, interval_s=5.0, say=lambda _: None, clock=clock, sleep=clock.sleep)
    asked: list[float] = views.asked  # type: ignore[attr-defined]
    assert asked[0] == 15.0 and asked[-1] == 1.0 and all(a <= 15.0 for a in asked)
