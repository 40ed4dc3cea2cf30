"""What the notifier and the commit-status sender share: a bounded queue that callers append to without
ever blocking (when it is full the oldest item goes, counted), and one daemon thread, started with the
first item, that works it off on an event loop of its own (`_main`, each sender's). `drain(timeout_s)`
waits until the queue is worked off; `close(wait_s)` waits up to `wait_s` for that, says how much it
leaves unsent, then stops the thread. The thread never takes the process down: an exception ends it,
logged."""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
from typing import Generic, TypeVar

from prometheus_client import Counter, Gauge

from fleetllm.logs import log_event

T = TypeVar("T")


class BackgroundSender(Generic[T]):
    """The queue and the thread; a subclass writes `_main` (take items with `_take`, and call
    `_mark_idle` when it has nothing left in flight) and may note a dropped item (`_dropped`)."""

    def __init__(self, *, queue_size: int, queued: Gauge, dropped: Counter, log: logging.Logger,
                 thread_name: str, items: str, sender: str) -> None:
        self._queue_size = queue_size
        self._queued = queued
        self._dropped_counter = dropped
        self._log = log
        self._thread_name = thread_name
        self._items = items  # "notifications": what close() leaves unsent
        self._sender = sender  # "notification sender": what stopped, when the thread ends on an error
        self._queue: collections.deque[T] = collections.deque()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None

    def _put(self, item: T) -> None:
        """Queue `item` for the thread (never blocks; nothing once closed)."""
        if self._closed.is_set():
            return
        with self._lock:
            if len(self._queue) >= self._queue_size:
                self._dropped(self._queue.popleft())
                self._dropped_counter.inc()
            self._queue.append(item)
            self._queued.set(len(self._queue))
            self._idle.clear()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._thread_name, daemon=True)
                self._thread.start()
        self._wake.set()

    def _dropped(self, item: T) -> None:
        """`item` was dropped unsent because the queue was full (already counted)."""

    def _take(self) -> T | None:
        with self._lock:
            item = self._queue.popleft() if self._queue else None
            self._queued.set(len(self._queue))
            return item

    def _mark_idle(self) -> None:
        """Nothing is in flight: idle unless an item was put since the last take (checked under the lock
        that `_put` clears the flag under, so a drain never returns with an item queued)."""
        with self._lock:
            if not self._queue:
                self._idle.set()

    async def _wait_for_work(self) -> None:
        """Until an item is put, or half a second (the loop then looks at `_closed` again)."""
        await asyncio.to_thread(self._wake.wait, 0.5)
        self._wake.clear()

    def drain(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` until everything queued was sent (or given up on)."""
        return self._idle.wait(timeout_s) if timeout_s > 0 else self._idle.is_set()

    def close(self, wait_s: float = 0.0) -> bool:
        """Wait up to `wait_s` for what is queued and in flight, then stop. True when all was sent or given up on."""
        drained = self.drain(wait_s)
        if not drained:
            with self._lock:
                left = len(self._queue)
            log_event(self._log, f"{self._items} not sent before exit", logging.WARNING, queued=left,
                      waited_s=wait_s)
        self._closed.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        return drained

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except Exception as exc:  # the sender must never take the process down
            log_event(self._log, f"{self._sender} stopped", logging.ERROR, error=f"{type(exc).__name__}: {exc}")
        finally:
            self._idle.set()

    async def _main(self) -> None:
        raise NotImplementedError


__all__ = ["BackgroundSender"]
