"""Busy-polling: a worker about to sleep on a short wait polls its event loop for a few microseconds first.

Why: a worker that sleeps in epoll_wait gives its CPU up; waking it again costs more than the wait
itself when the wait is short. On the 2-core virtual machines of docs/benchmarks.md an idle vCPU halts
and the wake-up that follows costs tens of microseconds, cold caches included: at one connection that
was most of what the gateway added to a request (docs/benchmarks.md, "Eighth round"). Go's scheduler, and
so LLMhop, spins before it parks a thread; Linux's haltpoll governor polls before it halts a vCPU; Netty
has a busy-wait select strategy. This module is the same idea for an asyncio loop.

Where: at two waits only, and only when the worker has nothing else to do:
- the answer to a client has gone and no request of any connection is being answered (the wait for the
  next request: `client`);
- a request went upstream and it is the only one this worker is answering (the wait for the response
  head: `upstream`).
Never while streaming a body, never with other requests in flight (their CPU is better spent on them).

How: poll the loop's own epoll descriptor (every socket the loop watches, so any event ends the spin,
not only the awaited one) without sleeping, until something is ready or the window ends; then the loop
waits as usual and finds the event at once. Each wait has its own window, adapted as haltpoll adapts its
own: a wait that ended within the limit doubles it (from GROW_FROM), a longer one halves it, below
GROW_FROM it closes. In front of a vLLM (responses take milliseconds, clients come at random) the windows
close after a few waits, and spinning costs nothing; they open again only when waits get short.

`--busy-poll 0` turns it off. A loop whose descriptor cannot be found (neither uvloop nor an epoll
selector) does not busy-poll.
"""

from __future__ import annotations

import select
import selectors
from time import perf_counter
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # not imported at run time: the CLI reads DEFAULT_LIMIT_US before any loop exists
    import asyncio

DEFAULT_LIMIT_US = 100  # microseconds: the longest spin
GROW_FROM = 0.125  # of the limit: a closed window opens at this, and closes below it


def adapt(window: float, waited: float, limit: float) -> float:
    """The next window after a wait of `waited` seconds (spun, or spun and then slept)."""
    if waited <= limit:
        return min(limit, max(window * 2, limit * GROW_FROM))
    half = window / 2
    return half if half >= limit * GROW_FROM else 0.0


def loop_fd(loop: asyncio.AbstractEventLoop) -> int | None:
    """The descriptor the loop sleeps on (libuv's epoll under uvloop, the selector's under asyncio)."""
    backend = getattr(loop, "_get_backend_id", None)  # uvloop: uv_backend_fd()
    if callable(backend):
        fd = backend()
        return fd if isinstance(fd, int) and fd >= 0 else None
    selector = getattr(loop, "_selector", None)  # asyncio's selector loop
    epoll = getattr(selectors, "EpollSelector", None)  # Linux only
    if epoll is not None and isinstance(selector, epoll):
        return int(selector.fileno())
    return None


class Window:
    """One wait's adaptive spin window, in seconds."""

    __slots__ = ("limit", "value")

    def __init__(self, limit: float) -> None:
        self.limit = limit
        self.value = limit

    def learn(self, waited: float) -> None:
        self.value = adapt(self.value, waited, self.limit)


class BusyPoll:
    """One worker's busy-polling. `busy` counts the requests it is answering (its HttpServer keeps it);
    the connections call `woke()` when bytes arrive and a wait is being timed (`timing`)."""

    __slots__ = ("_poll", "busy", "client", "timing", "upstream")

    def __init__(self, fd: int, limit: float) -> None:
        self._poll = select.poll()
        self._poll.register(fd, select.POLLIN)
        self.busy = 0
        self.client = Window(limit)
        self.upstream = Window(limit)
        self.timing: tuple[Window, float] | None = None  # the wait that slept, and when it began

    @classmethod
    def for_loop(cls, loop: asyncio.AbstractEventLoop, limit_us: int) -> BusyPoll | None:
        """None when `limit_us` is 0 or the loop's descriptor cannot be found."""
        fd = loop_fd(loop) if limit_us > 0 else None
        return cls(fd, limit_us / 1e6) if fd is not None else None

    def before_client_wait(self) -> None:
        """An answer went out: spin for the next request when nothing else is being answered."""
        if self.busy == 0:
            self._spin(self.client)

    def before_upstream_wait(self) -> None:
        """A request went upstream: spin for its answer when it is the only one being answered."""
        if self.busy <= 1:
            self._spin(self.upstream)

    def _spin(self, window: Window) -> None:
        started = perf_counter()
        span = window.value
        if span:
            deadline = started + span
            poll = self._poll.poll
            while True:
                if poll(0):
                    window.learn(perf_counter() - started)
                    self.timing = None
                    return
                if perf_counter() >= deadline:
                    break
        self.timing = (window, started)  # the loop sleeps: how long is learnt when bytes arrive

    def woke(self) -> None:
        """Bytes arrived after a wait that slept: the window learns how long it was."""
        timing, self.timing = self.timing, None
        if timing is not None:
            window, started = timing
            window.learn(perf_counter() - started)
