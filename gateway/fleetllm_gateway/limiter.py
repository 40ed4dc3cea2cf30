"""A per-model concurrency limit with a short, bounded, first-come-first-served queue.

LLMhop has one router-wide limit (8) and answers 503 at once when it is full. Here each model has
`limit` slots; a request that finds them taken waits in a queue of at most `max_queued` entries for at
most `timeout` seconds, and gets 503 only when the queue is full or its wait runs out. `max_queued=0`
gives LLMhop's immediate 503; `limit=0` disables the limit. A released slot passes straight to the
oldest waiter, so a later arrival never overtakes the queue.
"""

from __future__ import annotations

import asyncio
import enum
from collections import deque
from collections.abc import Callable
from typing import Protocol

POLL = 0.002  # seconds between two tries of a worker whose queue waits for a slot another worker frees


class SharedSlots(Protocol):
    """A model's slots shared by every worker: a process-shared counting semaphore (multiprocessing's,
    made before the workers are forked); acquire(False) is sem_trywait, release() is sem_post."""

    def acquire(self, block: bool = ...) -> bool: ...

    def release(self) -> None: ...


class Admission(enum.Enum):
    ADMITTED = "admitted"
    QUEUE_FULL = "queue_full"
    TIMED_OUT = "timed_out"


class Limiter:
    """With `shared` (several workers), a slot is one unit of the shared semaphore: the limit holds
    across every worker exactly. The queue is this worker's: first come first served among its own
    requests; a slot another worker frees is taken by a waiting worker within POLL seconds (or at once,
    when it frees one itself). `on_change(active, queued)` is told each change (the metrics' gauges)."""

    __slots__ = ("_poller", "_waiters", "active", "limit", "max_queued", "on_change", "shared", "timeout")

    def __init__(self, limit: int, max_queued: int, timeout: float, *, shared: SharedSlots | None = None,
                 on_change: Callable[[int, int], None] | None = None) -> None:
        self.limit = limit
        self.max_queued = max_queued
        self.timeout = timeout  # 0: wait as long as it takes
        self.shared = shared if limit else None
        self.on_change = on_change
        self.active = 0  # slots this worker holds
        self._waiters: deque[asyncio.Future[bool]] = deque()
        self._poller: asyncio.TimerHandle | None = None

    @property
    def queued(self) -> int:
        return len(self._waiters)

    @property
    def full(self) -> bool:
        """No slot free and the queue full: acquire() would answer QUEUE_FULL now (a hint for answering
        before a body is read; acquire() still decides)."""
        if self.limit == 0 or len(self._waiters) < self.max_queued:
            return False
        if self._waiters:
            return True
        shared = self.shared
        if shared is None:
            return self.active >= self.limit
        get_value = getattr(shared, "get_value", None)
        return get_value is not None and get_value() == 0

    def _take(self) -> bool:
        shared = self.shared
        return self.active < self.limit if shared is None else shared.acquire(False)

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change(self.active, len(self._waiters))

    async def acquire(self) -> Admission:
        if self.limit == 0 or (not self._waiters and self._take()):
            self.active += 1
            self._changed()
            return Admission.ADMITTED
        if len(self._waiters) >= self.max_queued:
            return Admission.QUEUE_FULL
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[bool] = loop.create_future()
        self._waiters.append(waiter)
        self._changed()
        if self.shared is not None and self._poller is None:
            self._poller = loop.call_later(POLL, self._poll)
        timer = loop.call_later(self.timeout, self._expire, waiter) if self.timeout > 0 else None
        try:
            granted = await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled() and waiter.result():
                self.release()  # the slot arrived as we were cancelled: hand it on
            elif waiter in self._waiters:
                self._waiters.remove(waiter)
                self._changed()
            raise
        finally:
            if timer is not None:
                timer.cancel()
        return Admission.ADMITTED if granted else Admission.TIMED_OUT

    def _expire(self, waiter: asyncio.Future[bool]) -> None:
        if not waiter.done():
            self._waiters.remove(waiter)
            waiter.set_result(False)
            self._changed()

    def _grant(self) -> None:
        """Give free slots to the oldest waiters."""
        waiters = self._waiters
        while waiters:
            if waiters[0].done():
                waiters.popleft()
                continue
            if not self._take():
                break
            self.active += 1
            waiters.popleft().set_result(True)
        self._changed()

    def _poll(self) -> None:
        self._poller = None
        self._grant()
        if self._waiters:
            self._poller = asyncio.get_running_loop().call_later(POLL, self._poll)

    def release(self) -> None:
        """Give the slot to the oldest waiter (the active count stays) or free it."""
        if self.shared is not None:
            self.active -= 1
            self.shared.release()
            self._grant()
            return
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(True)
                self._changed()
                return
        self.active -= 1
        self._changed()


class ByteBudget:
    """Bytes of request bodies the gateway may hold in memory at once, shared by every model.

    A body-routed request needs its body before its model, hence before a model's slot, so it reserves
    each chunk of its body here before keeping it, and holds what it reserved until it ends: a client
    that sends slowly holds only what it sent. Reservations wait in FIFO order for at most `timeout`
    seconds (0: as long as it takes); `total` 0 means no budget. A body declared larger than `total`
    could never be held: the caller answers 413 before reading it.
    """

    __slots__ = ("_waiters", "held", "timeout", "total")

    def __init__(self, total: int, timeout: float) -> None:
        self.total = total
        self.timeout = timeout
        self.held = 0
        self._waiters: deque[tuple[int, asyncio.Future[bool]]] = deque()

    def fits(self, amount: int) -> bool:
        return self.total == 0 or amount <= self.total

    async def acquire(self, amount: int) -> bool:
        """True once `amount` bytes are reserved, False when the wait ran out."""
        if self.total == 0 or amount == 0:
            return True
        if not self._waiters and self.held + amount <= self.total:
            self.held += amount
            return True
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[bool] = loop.create_future()
        entry = (amount, waiter)
        self._waiters.append(entry)
        timer = loop.call_later(self.timeout, self._expire, entry) if self.timeout > 0 else None
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled() and waiter.result():
                self.release(amount)  # granted as we were cancelled: give it back
            elif entry in self._waiters:
                self._waiters.remove(entry)
                self._grant()
            raise
        finally:
            if timer is not None:
                timer.cancel()

    def _expire(self, entry: tuple[int, asyncio.Future[bool]]) -> None:
        if not entry[1].done():
            self._waiters.remove(entry)
            entry[1].set_result(False)
            self._grant()  # a large head-of-line request gave up: smaller ones behind it may fit

    def release(self, amount: int) -> None:
        if self.total == 0 or amount == 0:
            return
        self.held -= amount
        self._grant()

    def _grant(self) -> None:
        while self._waiters:
            amount, waiter = self._waiters[0]
            if waiter.done():
                self._waiters.popleft()
                continue
            if self.held + amount > self.total:
                return
            self._waiters.popleft()
            self.held += amount
            waiter.set_result(True)
