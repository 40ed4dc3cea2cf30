"""The reconcile loop's wait between passes ends early when a sync request is taken (`wake`), and goes
on when the store cannot be asked."""

from __future__ import annotations

import asyncio

import pytest

from fleetllm.job import loop


def test_a_sync_request_ends_the_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loop, "SYNC_POLL_S", 0.01)
    asked: list[int] = []

    def wake() -> bool:
        asked.append(1)
        return len(asked) == 3

    asyncio.run(asyncio.wait_for(loop.wait_for_next(asyncio.Event(), 3600, wake), timeout=60))
    assert len(asked) == 3  # returned on the third look, an hour before the schedule


def test_a_failing_store_is_logged_once_and_the_wait_goes_on(monkeypatch: pytest.MonkeyPatch,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(loop, "SYNC_POLL_S", 0.01)
    calls: list[int] = []

    def wake() -> bool:
        calls.append(1)
        if len(calls) < 5:
            raise OSError("state store down")
        return True

    asyncio.run(asyncio.wait_for(loop.wait_for_next(asyncio.Event(), 3600, wake), timeout=60))
    assert len(calls) == 5
    assert [r.getMessage() for r in caplog.records].count("sync_check_failed") == 1


def test_without_wake_the_wait_is_the_schedule_and_stop_ends_it() -> None:
    async def scenario() -> None:
        stop = asyncio.Event()
        waiting = asyncio.ensure_future(loop.wait_for_next(stop, 3600))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        stop.set()
        await asyncio.wait_for(waiting, timeout=10)

    asyncio.run(scenario())
