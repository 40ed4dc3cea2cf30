"""One keep-alive connection to an upstream, as an asyncio protocol with the reads a proxy needs.

Reading pauses when more than `_HIGH_WATER` bytes wait unconsumed (a slow client behind a fast
upstream), and writing waits while the transport's buffer is full (a streamed request body).
"""

from __future__ import annotations

import asyncio
from typing import cast

from fleetllm_gateway.errors import GatewayError

_HIGH_WATER = 256 * 1024


class UpstreamError(GatewayError):
    """The upstream could not be reached or broke HTTP; the message is safe to show (no secrets)."""


class Connection(asyncio.Protocol):
    __slots__ = ("_data_waiter", "_drain_waiter", "_reading_paused", "_write_paused", "buffer", "closed",
                 "idle_since", "received", "transport")

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.closed = False  # EOF or connection lost: nothing more will arrive
        self.received = False  # any byte of the current exchange
        self.idle_since = 0.0
        self._data_waiter: asyncio.Future[None] | None = None
        self._drain_waiter: asyncio.Future[None] | None = None
        self._reading_paused = False
        self._write_paused = False

    # asyncio.Protocol callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not asyncio.Transport subclasses

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        self.received = True
        if len(self.buffer) > _HIGH_WATER and not self._reading_paused and self.transport is not None:
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
        if self._drain_waiter is not None and not self._drain_waiter.done():
            self._drain_waiter.set_result(None)

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._drain_waiter is not None and not self._drain_waiter.done():
            self._drain_waiter.set_result(None)

    def _wake(self) -> None:
        if self._data_waiter is not None and not self._data_waiter.done():
            self._data_waiter.set_result(None)

    # used by the exchange
    def write(self, data: bytes | bytearray) -> None:
        if self.closed or self.transport is None or self.transport.is_closing():
            raise UpstreamError("upstream closed the connection")
        self.transport.write(data)

    async def drain(self) -> None:
        if self._write_paused and not self.closed:
            self._drain_waiter = asyncio.get_running_loop().create_future()
            await self._drain_waiter
        if self.closed:
            raise UpstreamError("upstream closed the connection")

    async def more(self) -> None:
        """Wait until more data arrived; raise if the upstream closed instead."""
        if self.closed:
            raise UpstreamError("upstream closed the connection mid-response")
        if self._reading_paused and self.transport is not None:
            self._reading_paused = False
            self.transport.resume_reading()
        self._data_waiter = asyncio.get_running_loop().create_future()
        await self._data_waiter

    def take(self, n: int) -> bytes:
        buffer = self.buffer
        if n >= len(buffer):  # all of it: one copy, not a slice and then a copy of the slice
            data = bytes(buffer)
            buffer.clear()
            return data
        data = bytes(buffer[:n])
        del buffer[:n]
        return data

    async def read_until(self, separator: bytes, limit: int) -> bytes:
        start = 0
        while True:
            index = self.buffer.find(separator, start)
            if index >= 0:
                data = self.take(index)
                del self.buffer[:len(separator)]
                return data
            if len(self.buffer) > limit:
                raise UpstreamError("upstream sent an oversized response head or chunk line")
            start = max(0, len(self.buffer) - len(separator) + 1)
            await self.more()

    async def read_some(self, at_most: int) -> bytes:
        while not self.buffer:
            await self.more()
        return self.take(at_most)

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()
