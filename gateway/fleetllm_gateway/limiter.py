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


class Admission(enum.Enum):
    ADMITTED = "admitted"
    QUEUE_FULL = "queue_full"
    TIMED_OUT = "timed_out"


class Limiter:
    __slots__ = ("_waiters", "active", "limit", "max_queued", "timeout")

    def __init__(self, limit: int, max_queued: int, timeout: float) -> None:
        self.limit = limit
        self.max_queued = max_queued
        self.timeout = timeout  # 0: wait as long as it takes
        self.active = 0
        self._waiters: deque[asyncio.Future[bool]] = deque()

    @property
    def queued(self) -> int:
        return len(self._waiters)

    @property
    def full(self) -> bool:
        """No slot free and the queue full: acquire() would answer QUEUE_FULL now (a hint for answering
        before a body is read; acquire() still decides)."""
        return self.limit != 0 and (self.active >= self.limit or bool(self._waiters)) \
            and len(self._waiters) >= self.max_queued

    async def acquire(self) -> Admission:
        if self.limit == 0 or (self.active < self.limit and not self._waiters):
            self.active += 1
            return Admission.ADMITTED
        if len(self._waiters) >= self.max_queued:
            return Admission.QUEUE_FULL
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[bool] = loop.create_future()
        self._waiters.append(waiter)
        timer = loop.call_later(self.timeout, self._expire, waiter) if self.timeout > 0 else None
        try:
            granted = await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled() and waiter.result():
                self.release()  # the slot arrived as we were cancelled: hand it on
            elif waiter in self._waiters:
                self._waiters.remove(waiter)
            raise
        finally:
            if timer is not None:
                timer.cancel()
        return Admission.ADMITTED if granted else Admission.TIMED_OUT

    def _expire(self, waiter: asyncio.Future[bool]) -> None:
        if not waiter.done():
            self._waiters.remove(waiter)
            waiter.set_result(False)

    def release(self) -> None:
        """Give the slot to the oldest waiter (the active count stays) or free it."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(True)
                return
        self.active -= 1


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
