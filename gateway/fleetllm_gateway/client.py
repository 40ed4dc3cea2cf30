"""A small HTTP/1.1 client for upstreams: one keep-alive pool per model, over TCP, TLS or a unix socket.

Why not aiohttp's client: on 2 cores it capped a body-routed gateway at about 4,400 req/s, a third of
what this protocol-level client allows (docs/benchmarks.md). It does only what a reverse proxy needs:
write a request head and a body (bytes, or a stream sent as-is or chunked) and return the response
once its head is in (response.py relays the body; connection.py is the socket side).

Timeouts: connecting is bounded (`connect_timeout`); a response, streaming or not, is never timed
out. Idle connections are reused LIFO, at most `max_idle` are kept, and one idle longer than
`IDLE_TIMEOUT` is closed when it expires, by one timer a pool (uvicorn, behind vLLM, drops idle ones
after 5 s; an upstream that never does is not left holding them until the next request). A
request whose body is in memory is retried once on a fresh connection when a reused one turns out to
be closed before any response byte arrived.
"""

from __future__ import annotations

import asyncio
import os
import ssl
import time
from collections.abc import AsyncIterable

from fleetllm_gateway.busypoll import BusyPoll
from fleetllm_gateway.connection import Connection, UpstreamError
from fleetllm_gateway.proxyenv import Proxy
from fleetllm_gateway.response import MAX_HEAD_BYTES, Response, StaleError, read_response
from fleetllm_gateway.target import Target

__all__ = ["IDLE_TIMEOUT", "Pool", "Response", "UpstreamError", "describe"]

IDLE_TIMEOUT = 4.0
# The expiry timer fires this much after a connection's time is up: uvloop rounds a timer to whole
# milliseconds of a clock read once a loop pass, so one due sooner may fire before its time and spin.
_EXPIRY_SLACK = 0.01
SMALL_WRITE = 64 * 1024  # bodies up to this size go out in one write with the head


class Pool:
    """Keep-alive connections to one target; `max_idle` is sized to the model's concurrency limit."""

    def __init__(self, target: Target, *, max_idle: int, connect_timeout: float, proxy: Proxy | None = None,
                 busy_poll: BusyPoll | None = None, idle_timeout: float = IDLE_TIMEOUT) -> None:
        self.target = target
        self.busy_poll = busy_poll
        self.max_idle = max_idle
        self.connect_timeout = connect_timeout
        self.proxy = proxy
        # Through a proxy, plain-http requests name their target in absolute form and carry the proxy's
        # credentials; https ones go through a CONNECT tunnel and look like direct ones.
        self.absolute_form = f"http://{target.authority}" if proxy and target.scheme == "http" else ""
        self.proxy_header = proxy.header if proxy and target.scheme == "http" else ""
        self.idle_timeout = idle_timeout
        self._idle: list[Connection] = []  # oldest release first: reused from the end, expired from the start
        self._expiry: asyncio.TimerHandle | None = None  # the next _expire, while any connection is idle
        self._closed = False  # after close() (a reload replaced this pool), released connections are closed
        self._ssl: ssl.SSLContext | None = ssl.create_default_context() if target.scheme == "https" else None

    def _idle_connection(self) -> Connection | None:
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()
            if conn.closed or conn.buffer or now - conn.idle_since > self.idle_timeout:
                conn.abort()
                continue
            return conn
        return None

    async def _connect(self) -> Connection:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(self._open(loop), self.connect_timeout)
        except (TimeoutError, asyncio.TimeoutError):  # noqa: UP041 - distinct classes before Python 3.11
            raise UpstreamError(f"connect timed out after {self.connect_timeout:g} s") from None
        except OSError as exc:
            raise UpstreamError(f"connect failed: {_os_reason(exc)}") from None
        return conn

    async def _open(self, loop: asyncio.AbstractEventLoop) -> tuple[object, Connection]:
        target, proxy = self.target, self.proxy
        if target.is_unix:
            return await loop.create_unix_connection(Connection, target.socket_path)
        if proxy is None:
            return await loop.create_connection(Connection, target.host, target.port, ssl=self._ssl,
                                                server_hostname=target.host if self._ssl else None)
        transport, conn = await loop.create_connection(Connection, proxy.host, proxy.port)
        if self._ssl is None:
            return transport, conn
        try:
            conn.write(f"CONNECT {target.authority_with_port} HTTP/1.1\r\nHost: {target.authority_with_port}\r\n"
                       f"{proxy.header}\r\n".encode())
            head = await conn.read_until(b"\r\n\r\n", MAX_HEAD_BYTES)
            status = [*head.split(b" ", 2), b""][1]
            if status != b"200":
                raise UpstreamError(f"proxy answered CONNECT with {status.decode('latin-1')[:3] or 'garbage'}")
            tls = await loop.start_tls(transport, conn, self._ssl, server_hostname=target.host)
        except BaseException:
            conn.abort()
            raise
        if tls is None:
            raise UpstreamError("TLS through the proxy failed")
        conn.transport = tls
        return tls, conn

    def release(self, conn: Connection) -> None:
        if conn.closed or self._closed or len(self._idle) >= self.max_idle:
            conn.abort()
            return
        conn.idle_since = time.monotonic()
        self._idle.append(conn)
        if self._expiry is None:
            self._expiry = conn.loop.call_later(self.idle_timeout + _EXPIRY_SLACK, self._expire)

    def _expire(self) -> None:
        """Close the connections idle longer than `idle_timeout` (and any the upstream closed), off every
        request's path; come back when the oldest one left expires."""
        self._expiry = None
        now = time.monotonic()
        kept: list[Connection] = []
        for conn in self._idle:
            if conn.closed or now - conn.idle_since >= self.idle_timeout:
                conn.abort()
            else:
                kept.append(conn)
        self._idle = kept
        if kept:
            due = kept[0].idle_since + self.idle_timeout - now
            self._expiry = kept[0].loop.call_later(due + _EXPIRY_SLACK, self._expire)

    def close(self) -> None:
        self._closed = True
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        while self._idle:
            self._idle.pop().abort()

    async def send(self, head: bytes, body: bytes | bytearray | AsyncIterable[bytes] | None, *,
                   chunked: bool, head_request: bool) -> Response:
        """Send one request and return its response once the head has arrived."""
        for _attempt in range(2):
            conn = self._idle_connection()
            reused = conn is not None
            if conn is None:
                conn = await self._connect()
                conn.busy_poll = self.busy_poll
            conn.received = False
            try:
                if isinstance(body, (bytes, bytearray)):
                    if len(body) <= SMALL_WRITE:
                        conn.write(head + body)  # one segment
                    else:  # no copy of a large body
                        conn.write(head)
                        conn.write(body)
                else:
                    conn.write(head)
                    if body is not None:
                        await _send_stream(conn, body, chunked)
                if self.busy_poll is not None and not conn.buffer:
                    self.busy_poll.before_upstream_wait()
                return await read_response(conn, self.release, head_request,
                                           may_be_stale=reused and isinstance(body, (bytes, bytearray)))
            except StaleError:
                conn.abort()
                continue
            except BaseException:
                conn.abort()
                raise
        raise UpstreamError("upstream closed the connection before answering")


async def _send_stream(conn: Connection, body: AsyncIterable[bytes], chunked: bool) -> None:
    async for chunk in body:
        if chunk:
            conn.write(b"%x\r\n%b\r\n" % (len(chunk), chunk) if chunked else chunk)
            await conn.drain()
    if chunked:
        conn.write(b"0\r\n\r\n")


def describe(exc: BaseException) -> str:
    """A short, secret-free reason for logs and 502 bodies."""
    if isinstance(exc, UpstreamError):
        return str(exc)
    if isinstance(exc, OSError):
        return _os_reason(exc)
    return type(exc).__name__


def _os_reason(exc: OSError) -> str:
    """`Connection refused`, whichever loop raised it (asyncio's own message names the address)."""
    if isinstance(exc, ssl.SSLError):
        return f"TLS error: {exc.reason or type(exc).__name__}"
    if exc.errno:
        return os.strerror(exc.errno)
    return exc.strerror or type(exc).__name__
