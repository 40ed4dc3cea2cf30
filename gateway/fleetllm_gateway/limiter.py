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
from dataclasses import dataclass
from typing import Any, Protocol

POLL = 0.002  # seconds between two tries of a worker whose queue waits for a slot another worker frees


class Semaphore(Protocol):
    """A process-shared counting semaphore (multiprocessing's, made before the workers are forked):
    acquire(False) is sem_trywait, release() is sem_post, get_value() is sem_getvalue."""

    def acquire(self, block: bool = True) -> bool: ...

    def release(self) -> None: ...

    def get_value(self) -> int: ...


@dataclass(frozen=True)
class SharedSlots:
    """A model's limits shared by every worker: `slots` counts the free slots (the limit), `places` the
    free places in the queue (maxQueuedRequests)."""

    slots: Semaphore
    places: Semaphore


class _Polling:
    """With several workers, a worker whose queue waits tries again every POLL seconds: a slot or byte
    another worker frees wakes nobody here."""

    __slots__ = ("_poller", "_waiters")
    _poller: asyncio.TimerHandle | None
    _waiters: deque[Any]

    def _grant(self) -> None:
        raise NotImplementedError

    def _poll(self) -> None:
        self._poller = None
        self._grant()
        if self._waiters:
            self._poller = asyncio.get_running_loop().call_later(POLL, self._poll)


class Admission(enum.Enum):
    ADMITTED = "admitted"
    QUEUE_FULL = "queue_full"
    TIMED_OUT = "timed_out"


class Limiter(_Polling):
    """With `shared` (several workers), a slot is a unit of the shared `slots` semaphore and a place in
    the queue a unit of `places`: the limit and the queue's length hold across every worker exactly.
    The order is first come first served among one worker's requests; a slot another worker frees is
    taken by a waiting worker within POLL seconds (at once by the worker that frees it, when it has a
    waiter). `on_change(active, queued)` is told each change of this worker's counts (the gauges)."""

    __slots__ = ("active", "limit", "max_queued", "on_change", "shared", "timeout")

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
        if self.limit == 0:
            return False
        shared = self.shared
        if shared is None:
            return len(self._waiters) >= self.max_queued and (self.active >= self.limit or bool(self._waiters))
        return shared.places.get_value() == 0 and (bool(self._waiters) or shared.slots.get_value() == 0)

    def _take(self) -> bool:
        shared = self.shared
        return self.active < self.limit if shared is None else shared.slots.acquire(False)

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change(self.active, len(self._waiters))

    def _left_queue(self) -> None:
        """A waiter left the queue (granted, expired or cancelled): its place is free again."""
        if self.shared is not None:
            self.shared.places.release()

    def take_now(self) -> bool:
        """Take a slot if that needs no wait (a slot free, nobody queued ahead); False otherwise, nothing
        taken, and `acquire` decides. Spares the common case a coroutine."""
        if self.limit == 0 or (not self._waiters and self._take()):
            self.active += 1
            self._changed()
            return True
        return False

    async def acquire(self) -> Admission:
        if self.take_now():
            return Admission.ADMITTED
        shared = self.shared
        if (len(self._waiters) >= self.max_queued) if shared is None else not shared.places.acquire(False):
            return Admission.QUEUE_FULL
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[bool] = loop.create_future()
        self._waiters.append(waiter)
        self._changed()
        if shared is not None and self._poller is None:
            self._poller = loop.call_later(POLL, self._poll)
        timer = loop.call_later(self.timeout, self._expire, waiter) if self.timeout > 0 else None
        try:
            granted = await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled() and waiter.result():
                self.release()  # the slot arrived as we were cancelled: hand it on
            elif waiter in self._waiters:
                self._waiters.remove(waiter)
                self._left_queue()
                self._changed()
            raise
        finally:
            if timer is not None:
                timer.cancel()
        return Admission.ADMITTED if granted else Admission.TIMED_OUT

    def _expire(self, waiter: asyncio.Future[bool]) -> None:
        if not waiter.done():
            self._waiters.remove(waiter)
            self._left_queue()
            waiter.set_result(False)
            self._changed()

    def _grant(self) -> None:
        """Give free slots to the oldest waiters (several workers)."""
        waiters = self._waiters
        while waiters:
            if waiters[0].done():  # cancelled: its task has not run its except clause yet
                waiters.popleft()
                self._left_queue()
                continue
            if not self._take():
                break
            self.active += 1
            waiters.popleft().set_result(True)
            self._left_queue()
        self._changed()

    def release(self) -> None:
        """Give the slot to the oldest waiter (the active count stays) or free it."""
        if self.shared is not None:
            self.active -= 1
            self.shared.slots.release()
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


class SharedBytes(Protocol):
    """The bytes every worker holds, in shared memory under a process-shared lock (fleetllm_gateway.shared)."""

    def take(self, amount: int, total: int) -> bool: ...

    def give(self, amount: int) -> None: ...


class ByteBudget(_Polling):
    """Bytes of request bodies the gateway may hold in memory at once, shared by every model (and, with
    `shared`, by every worker: the budget is the gateway's, not each worker's).

    A body-routed request needs its body before its model, hence before a model's slot, so it reserves
    each chunk of its body here before keeping it, and holds what it reserved until it ends: a client
    that sends slowly holds only what it sent. Reservations wait in FIFO order (this worker's) for at
    most `timeout` seconds (0: as long as it takes); `total` 0 means no budget. A body declared larger
    than `total` could never be held: the caller answers 413 before reading it.
    """

    __slots__ = ("held", "shared", "timeout", "total")

    def __init__(self, total: int, timeout: float, *, shared: SharedBytes | None = None) -> None:
        self.total = total
        self.timeout = timeout
        self.shared = shared
        self.held = 0  # by this worker
        self._waiters: deque[tuple[int, asyncio.Future[bool]]] = deque()
        self._poller: asyncio.TimerHandle | None = None

    def fits(self, amount: int) -> bool:
        return self.total == 0 or amount <= self.total

    def _take(self, amount: int) -> bool:
        if self.shared is not None:
            if not self.shared.take(amount, self.total):
                return False
        elif self.held + amount > self.total:
            return False
        self.held += amount
        return True

    def take_now(self, amount: int) -> bool:
        """Reserve `amount` bytes if that needs no wait (nobody queued ahead, the budget has room); False
        otherwise, and then `acquire` waits its turn. Spares the common case a coroutine."""
        return self.total == 0 or amount == 0 or (not self._waiters and self._take(amount))

    async def acquire(self, amount: int) -> bool:
        """True once `amount` bytes are reserved, False when the wait ran out."""
        if self.total == 0 or amount == 0:
            return True
        if not self._waiters and self._take(amount):
            return True
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[bool] = loop.create_future()
        entry = (amount, waiter)
        self._waiters.append(entry)
        if self.shared is not None and self._poller is None:
            self._poller = loop.call_later(POLL, self._poll)
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
        if self.shared is not None:
            self.shared.give(amount)
        self._grant()

    def _grant(self) -> None:
        while self._waiters:
            amount, waiter = self._waiters[0]
            if waiter.done():
                self._waiters.popleft()
                continue
            if not self._take(amount):
                return
            self._waiters.popleft()
            waiter.set_result(True)
