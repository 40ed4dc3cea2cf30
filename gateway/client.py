"""A small HTTP/1.1 client for upstreams: one keep-alive pool per model, over TCP, TLS or a unix socket.

Why not aiohttp's client: on 2 cores it capped a body-routed gateway at about 4,400 req/s, a third of
what this protocol-level client allows (docs/benchmarks.md). It does only what a reverse proxy needs:
write a request head and a body (bytes, or a stream sent as-is or chunked), read the response head,
then hand out the body as it arrives, de-chunked, so SSE events pass one by one.

Timeouts: connecting is bounded (`connect_timeout`); a response, streaming or not, is never timed
out. Idle connections are reused LIFO, at most `max_idle` are kept, and one idle longer than
`IDLE_TIMEOUT` is closed rather than reused (uvicorn, behind vLLM, drops idle ones after 5 s). A
request whose body is in memory is retried once on a fresh connection when a reused one turns out to
be closed before any response byte arrived.
"""

from __future__ import annotations

import asyncio
import re
import ssl
import time
from collections.abc import AsyncIterable, AsyncIterator
from typing import cast

from gateway.target import Target

IDLE_TIMEOUT = 4.0
MAX_HEAD_BYTES = 64 * 1024
_HIGH_WATER = 256 * 1024  # pause reading the upstream when this much is buffered and unconsumed
_NO_BODY_STATUS = frozenset({204, 304})
_CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]{1,16}")


class UpstreamError(Exception):
    """The upstream could not be reached or broke HTTP; the message is safe to show (no secrets)."""


class _StaleError(Exception):
    """A reused connection was closed by the upstream before it answered."""


class _Connection(asyncio.Protocol):
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
    def write(self, data: bytes) -> None:
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
        data = bytes(self.buffer[:n])
        del self.buffer[:n]
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


class Pool:
    """Keep-alive connections to one target; `max_idle` is sized to the model's concurrency limit."""

    def __init__(self, target: Target, *, max_idle: int, connect_timeout: float) -> None:
        self.target = target
        self.max_idle = max_idle
        self.connect_timeout = connect_timeout
        self._idle: list[_Connection] = []
        self._ssl: ssl.SSLContext | None = ssl.create_default_context() if target.scheme == "https" else None

    def _idle_connection(self) -> _Connection | None:
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()
            if conn.closed or conn.buffer or now - conn.idle_since > IDLE_TIMEOUT:
                conn.abort()
                continue
            return conn
        return None

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        target = self.target
        try:
            if target.is_unix:
                opening = loop.create_unix_connection(_Connection, target.socket_path)
            else:
                opening = loop.create_connection(_Connection, target.host, target.port, ssl=self._ssl,
                                                 server_hostname=target.host if self._ssl else None)
            _, conn = await asyncio.wait_for(opening, self.connect_timeout)
        except (TimeoutError, asyncio.TimeoutError):  # noqa: UP041 - distinct classes before Python 3.11
            raise UpstreamError(f"connect timed out after {self.connect_timeout:g} s") from None
        except OSError as exc:
            raise UpstreamError(f"connect failed: {exc.strerror or type(exc).__name__}") from None
        return conn

    def release(self, conn: _Connection) -> None:
        if conn.closed or len(self._idle) >= self.max_idle:
            conn.abort()
            return
        conn.idle_since = time.monotonic()
        self._idle.append(conn)

    def close(self) -> None:
        while self._idle:
            self._idle.pop().abort()

    async def send(self, head: bytes, body: bytes | AsyncIterable[bytes] | None, *,
                   chunked: bool, head_request: bool) -> Response:
        """Send one request and return its response once the head has arrived."""
        for _attempt in range(2):
            conn = self._idle_connection()
            reused = conn is not None
            if conn is None:
                conn = await self._connect()
            conn.received = False
            try:
                if isinstance(body, bytes):
                    conn.write(head + body)
                else:
                    conn.write(head)
                    if body is not None:
                        await _send_stream(conn, body, chunked)
                return await _read_response(self, conn, head_request, may_be_stale=reused and isinstance(body, bytes))
            except _StaleError:
                conn.abort()
                continue
            except BaseException:
                conn.abort()
                raise
        raise UpstreamError("upstream closed the connection before answering")


async def _send_stream(conn: _Connection, body: AsyncIterable[bytes], chunked: bool) -> None:
    async for chunk in body:
        if chunk:
            conn.write(b"%x\r\n%b\r\n" % (len(chunk), chunk) if chunked else chunk)
            await conn.drain()
    if chunked:
        conn.write(b"0\r\n\r\n")


async def _read_response(pool: Pool, conn: _Connection, head_request: bool, *, may_be_stale: bool) -> Response:
    while True:
        try:
            head = await conn.read_until(b"\r\n\r\n", MAX_HEAD_BYTES)
        except UpstreamError:
            if may_be_stale and not conn.received:
                raise _StaleError() from None
            raise
        version, status, reason, headers = _parse_head(head)
        if status == 101:
            raise UpstreamError("upstream switched protocols, which the gateway does not support")
        if status >= 200:
            return Response(pool, conn, status, reason, headers, head_request, http10=version == "HTTP/1.0")
        # 1xx interim responses (100 Continue, 103 Early Hints) are consumed here


def _parse_head(head: bytes) -> tuple[str, int, str, list[tuple[str, str]]]:
    lines = head.decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    code, _, reason = rest.partition(" ")
    if not version.startswith("HTTP/1.") or len(code) != 3 or not code.isdigit():
        raise UpstreamError("upstream sent a malformed status line")
    headers: list[tuple[str, str]] = []
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon or not name or name != name.strip() or line[0] in " \t":
            raise UpstreamError("upstream sent a malformed header line")
        headers.append((name, value.strip(" \t")))
    return version, int(code), reason, headers


class Response:
    """A response whose head has arrived; read its body once with `read_all` or `chunks`, then
    `release()` the connection (it goes back to the pool only if the body was read to the end)."""

    def __init__(self, pool: Pool, conn: _Connection, status: int, reason: str,
                 headers: list[tuple[str, str]], head_request: bool, *, http10: bool = False) -> None:
        self.status = status
        self.reason = reason
        self.headers = headers
        self._pool = pool
        self._conn: _Connection | None = conn
        self._keep_alive = not http10  # HTTP/1.0 keeps a connection only when it says keep-alive
        self.content_length: int | None = None  # bytes of body that follow (None: unknown up front)
        self.declared_length: int | None = None  # a HEAD response's Content-Length, to relay as is
        self._chunked = False
        self._until_close = False
        self._complete = False
        self._classify(head_request)

    def _classify(self, head_request: bool) -> None:
        transfer_encoding: list[str] = []
        lengths: set[str] = set()
        for name, value in self.headers:
            lower = name.lower()
            if lower == "transfer-encoding":
                transfer_encoding += [t.strip().lower() for t in value.split(",") if t.strip()]
            elif lower == "content-length":
                lengths.update(v.strip() for v in value.split(","))
            elif lower == "connection":
                tokens = {t.strip().lower() for t in value.split(",")}
                self._keep_alive = "close" not in tokens and (self._keep_alive or "keep-alive" in tokens)
        if head_request or self.status in _NO_BODY_STATUS:
            self._complete = True  # no body follows, whatever the headers say
            self.content_length = 0
            if head_request and len(lengths) == 1 and next(iter(lengths)).isdigit():
                self.declared_length = int(next(iter(lengths)))
            return
        if transfer_encoding:
            self._chunked = transfer_encoding[-1] == "chunked"
            self._until_close = not self._chunked
        elif lengths:
            if len(lengths) != 1 or not next(iter(lengths)).isdigit():
                raise UpstreamError("upstream sent an invalid Content-Length")
            self.content_length = int(next(iter(lengths)))
            self._complete = self.content_length == 0
        else:
            self._until_close = True
        if self._until_close:
            self._keep_alive = False

    @property
    def streamed(self) -> bool:
        """Length unknown up front (chunked or until close), so it must be relayed as it comes."""
        return self.content_length is None

    async def read_all(self) -> bytes:
        return b"".join([chunk async for chunk in self.chunks()])

    async def chunks(self) -> AsyncIterator[bytes]:
        conn = self._conn
        if conn is None or self._complete:
            return
        if self._chunked:
            async for chunk in _dechunk(conn):
                yield chunk
        elif self.content_length is not None:
            remaining = self.content_length
            while remaining:
                data = await conn.read_some(remaining)
                remaining -= len(data)
                yield data
        else:
            while True:
                if conn.buffer:
                    yield conn.take(len(conn.buffer))
                elif conn.closed:
                    break
                else:
                    try:
                        await conn.more()
                    except UpstreamError:
                        break
        self._complete = True

    def release(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self._complete and self._keep_alive:
            self._pool.release(conn)
        else:
            conn.abort()


async def _dechunk(conn: _Connection) -> AsyncIterator[bytes]:
    while True:
        line = await conn.read_until(b"\r\n", 4096)
        size_text = line.split(b";", 1)[0].strip(b" \t")
        if not _CHUNK_SIZE.fullmatch(size_text):
            raise UpstreamError("upstream sent a malformed chunk")
        size = int(size_text, 16)
        if size == 0:
            while await conn.read_until(b"\r\n", MAX_HEAD_BYTES):
                pass  # trailers are not relayed (gateway/README.md)
            return
        remaining = size
        while remaining:
            data = await conn.read_some(remaining)
            remaining -= len(data)
            yield data
        if await conn.read_until(b"\r\n", 2) != b"":
            raise UpstreamError("upstream sent a malformed chunk")


def describe(exc: BaseException) -> str:
    """A short, secret-free reason for logs and 502 bodies."""
    if isinstance(exc, UpstreamError):
        return str(exc)
    if isinstance(exc, ssl.SSLError):
        return f"TLS error: {exc.reason or type(exc).__name__}"
    if isinstance(exc, OSError):
        return exc.strerror or type(exc).__name__
    return type(exc).__name__
