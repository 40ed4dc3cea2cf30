"""A stop signal always stops the demo: its KeyboardInterrupt, raised by the handler wherever the main
thread is, is lost when that is inside a finalizer (Python reports an exception raised in __del__ and
drops it). CI saw it: SIGTERM landed in GitPython's Repo.__del__ and the demo ran on. The handler also
sets procs.stop_asked, and the demo's loops wait in procs.pause, which raises it again."""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from fleetllm.demo import procs
from fleetllm.demo.run import _interrupt


@pytest.fixture(autouse=True)
def no_stop_left() -> Iterator[None]:
    procs.stop_asked.clear()
    yield
    procs.stop_asked.clear()


def test_a_stop_signal_lost_in_a_finalizer_stops_the_demo_at_its_next_pause(monkeypatch: pytest.MonkeyPatch) -> None:
    reported: list[type[BaseException] | None] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: reported.append(unraisable.exc_type))

    class Finalized:
        def __del__(self) -> None:
            _interrupt(signal.SIGTERM, None)  # as the handler runs when the signal lands here

    Finalized()
    assert reported == [KeyboardInterrupt]  # Python dropped it: nothing was raised here
    with pytest.raises(KeyboardInterrupt):
        procs.pause(30)


def test_pause_sleeps_when_no_stop_came() -> None:
    assert procs.pause(0.01) is None


def test_a_demo_run_starts_with_no_stop_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stop left from an earlier run in the same process must not stop the next one at once."""
    from fleetllm.demo.run import Demo

    procs.stop_asked.set()
    seen: list[bool] = []

    def set_up(self: Any) -> None:
        seen.append(procs.stop_asked.is_set())
        raise KeyboardInterrupt  # stop here: nothing more of a demo is wanted

    monkeypatch.setattr(Demo, "set_up", set_up)
    monkeypatch.setattr(Demo, "shut_down", lambda self: None)
    demo = Demo.__new__(Demo)
    demo.options = type("Options", (), {"once": True})()
    demo.say = lambda *args, **kwargs: None  # type: ignore[method-assign]
    assert demo.run() == 130
    assert seen == [False]
