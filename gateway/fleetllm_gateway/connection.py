"""One keep-alive connection to an upstream, as an asyncio protocol with the reads a proxy needs.

Reading pauses when more than `HIGH_WATER` bytes wait unconsumed (a slow client behind a fast
upstream), and writing waits while the transport's buffer is full (a streamed request body).
`FlowControl`, that wait, is shared with the server side's protocol (httpserver.py).
"""

from __future__ import annotations

import asyncio
from typing import cast

from fleetllm_gateway.busypoll import BusyPoll
from fleetllm_gateway.errors import GatewayError

HIGH_WATER = 256 * 1024  # bytes received and not yet consumed past which a protocol stops reading


def wake(waiter: asyncio.Future[None] | None) -> None:
    """Resolve a protocol's waiter, if one waits."""
    if waiter is not None and not waiter.done():
        waiter.set_result(None)


class FlowControl(asyncio.Protocol):
    """Write back-pressure: the transport calls pause_writing() when its buffer passes its high-water
    mark and resume_writing() once it drained; `_writable()` waits in between. A subclass calls
    `_wake_writer()` when its connection is lost, so nothing waits for a buffer that never drains."""

    __slots__ = ("_drain_waiter", "_write_paused")

    def __init__(self) -> None:
        self._drain_waiter: asyncio.Future[None] | None = None
        self._write_paused = False

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        self._wake_writer()

    def _wake_writer(self) -> None:
        wake(self._drain_waiter)

    async def _writable(self) -> None:
        """Return once the transport takes more (at once unless writing is paused)."""
        if self._write_paused:
            self._drain_waiter = asyncio.get_running_loop().create_future()
            try:
                await self._drain_waiter
            finally:
                self._drain_waiter = None


class UpstreamError(GatewayError):
    """The upstream could not be reached or broke HTTP; the message is safe to show (no secrets)."""


class Connection(FlowControl):
    __slots__ = ("_data_waiter", "_reading_paused", "buffer", "busy_poll", "closed", "idle_since", "loop",
                 "received", "transport")

    def __init__(self) -> None:
        super().__init__()
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.closed = False  # EOF or connection lost: nothing more will arrive
        self.received = False  # any byte of the current exchange
        self.idle_since = 0.0
        self._data_waiter: asyncio.Future[None] | None = None
        self._reading_paused = False
        self.busy_poll: BusyPoll | None = None  # its pool's

    # asyncio.Protocol callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not asyncio.Transport subclasses
        self.loop = asyncio.get_running_loop()  # once: each call of it asks the kernel for the process id

    def data_received(self, data: bytes) -> None:
        busy_poll = self.busy_poll
        if busy_poll is not None and busy_poll.timing is not None:
            busy_poll.woke()
        self.buffer += data
        self.received = True
        if len(self.buffer) > HIGH_WATER and not self._reading_paused and self.transport is not None:
            self.transport.pause_reading()
            self._reading_paused = True
        self._wake()

    def eof_received(self) -> bool:
        self.closed = True
        self._wake()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._wake()
        self._wake_writer()

    def _wake(self) -> None:
        wake(self._data_waiter)

    # used by the exchange
    def write(self, data: bytes | bytearray) -> None:
        if self.closed or self.transport is None or self.transport.is_closing():
            raise UpstreamError("upstream closed the connection")
        self.transport.write(data)

    async def drain(self) -> None:
        if not self.closed:
            await self._writable()
        if self.closed:
            raise UpstreamError("upstream closed the connection")

    def more(self) -> asyncio.Future[None]:
        """What to await until more data arrived; raises if the upstream closed instead. A future, not a
        coroutine: every wait of an exchange goes through here, and each frame on the awaiting chain is
        resumed again whenever the task wakes."""
        if self.closed:
            raise UpstreamError("upstream closed the connection mid-response")
        if self._reading_paused and self.transport is not None:
            self._reading_paused = False
            self.transport.resume_reading()
        self._data_waiter = waiter = self.loop.create_future()
        return waiter

    def take(self, n: int) -> bytes:
        buffer = self.buffer
        if n >= len(buffer):  # all of it: one copy, not a slice and then a copy of the slice
            data = bytes(buffer)
            buffer.clear()
            return data
        data = bytes(buffer[:n])
        del buffer[:n]
        return data

    def take_line(self, separator: bytes, limit: int, start: int = 0) -> bytes | None:
        """What comes before `separator` (both taken) when it is here, else None and nothing taken;
        UpstreamError when more than `limit` bytes came without it. `start`: where to look from."""
        buffer = self.buffer
        index = buffer.find(separator, start)
        if index < 0:
            if len(buffer) > limit:
                raise UpstreamError("upstream sent an oversized response head or chunk line")
            return None
        data = self.take(index)
        del buffer[:len(separator)]
        return data

    async def read_until(self, separator: bytes, limit: int) -> bytes:
        """`take_line`, waiting for the separator (the caller tries take_line first when that is likely
        to find it: no coroutine then)."""
        start = 0
        while (data := self.take_line(separator, limit, start)) is None:
            start = max(0, len(self.buffer) - len(separator) + 1)
            await self.more()
        return data

    async def read_some(self, at_most: int) -> bytes:
        while not self.buffer:
            await self.more()
        return self.take(at_most)

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()
