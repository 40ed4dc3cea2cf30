"""The gateway's HTTP/1.1 server: one asyncio protocol per client connection, driving llhttp (Node's
parser, through httptools) and handing each request to one handler, in order (it returns the answer, or an
awaitable of it). The control plane serves with it too (reconciler/fleetllm/server/httpserver.py), with
its own `Limits`.

What a connection gets, and what it is refused (gateway/README.md, "Limits"; the constants below are
the gateway's, and a server's `Limits` may set others):

- Requests are answered one at a time in the order they came; pipelined ones are parsed ahead (at most
  MAX_PIPELINED waiting, then reading pauses) and answered after the one before is written.
- Header block: HEADER_TIMEOUT seconds from the connection's opening (or a later request's first byte)
  to its end, else the connection is closed without an answer (LLMhop's ReadHeaderTimeout); at most
  MAX_HEAD_BYTES and MAX_FIELDS fields, each line at most MAX_LINE bytes, else 400.
- Malformed HTTP: 400 in plain text naming the kind of error (never the bytes sent, never llhttp's own
  words), one log line, and the connection closed. An error inside a body whose request is being
  answered fails that body's read instead (the handler answers), and the connection closes after it.
- A body is a stream the handler reads (`Body.readany`); past HIGH_WATER unread bytes reading pauses.
  A body left unread is drained for up to DRAIN_TIMEOUT before the next request (or the close), else
  the connection closes; after an unanswered `Expect: 100-continue` it closes at once.
- Idle keep-alive connections close after KEEPALIVE_TIMEOUT. One timer per connection covers both
  timeouts: it fires at most every HEADER_TIMEOUT while the connection waits for a client, and is not
  re-created per request.
- Upgrade requests (and CONNECT) are answered as plain requests, then the connection is closed.
- A handler that raises is a bug: a log line naming the exception's type and file:line, a 500 (or the
  connection cut when the head had gone), never a traceback to the client.
- Responses go out in one write (status line, headers and body); a streamed one holds its head back
  until its first chunk, chunked when its length is unknown; answers to HEAD carry no body.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time
import traceback
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, cast
from wsgiref.handlers import format_date_time  # RFC 9110's date; email.utils's formatdate weighs 1.2 MiB

import httptools

from fleetllm_gateway import errors
from fleetllm_gateway.busypoll import BusyPoll
from fleetllm_gateway.connection import HIGH_WATER, FlowControl, wake
from fleetllm_gateway.errors import IncompleteBodyError

log = logging.getLogger("gateway")

HEADER_TIMEOUT = 10.0  # seconds a request gets to send its header block, as LLMhop's (Go's ReadHeaderTimeout)
KEEPALIVE_TIMEOUT = 75.0  # seconds an idle keep-alive connection stays open (aiohttp's, which the gateway had)
DRAIN_TIMEOUT = 10.0  # seconds an unread request body gets to arrive (and be dropped) before the next request
MAX_LINE = 8190  # bytes of a request line or a header line (aiohttp's limit, which the gateway had)
MAX_HEAD_BYTES = 1 << 20  # bytes of a header block (Go's DefaultMaxHeaderBytes)
MAX_FIELDS = 1000  # header fields of one request
MAX_PIPELINED = 16  # requests parsed and waiting for their turn before reading pauses


@dataclass(frozen=True)
class Limits:
    """What one connection may take, and what the server calls itself. The gateway's are the module's
    constants above (`gateway_limits`); the control plane passes its own (server.* settings)."""

    header_timeout: float = HEADER_TIMEOUT
    keepalive_timeout: float = KEEPALIVE_TIMEOUT
    drain_timeout: float = DRAIN_TIMEOUT
    max_line: int = MAX_LINE
    max_head_bytes: int = MAX_HEAD_BYTES
    max_fields: int = MAX_FIELDS
    max_pipelined: int = MAX_PIPELINED
    header_jitter: float = 0.0  # each connection's header deadline falls at random in [1 - jitter, 1] of it
    server: str = "fleetllm-gateway"  # the Server header of every answer that sets none

    @property
    def line_too_long(self) -> str:
        return f"a request line or header line is too long (limit {self.max_line} bytes)"

    @property
    def head_too_large(self) -> str:
        return f"the header block is too large (limit {self.max_head_bytes} bytes and {self.max_fields} fields)"


def gateway_limits() -> Limits:
    """The gateway's limits: the module's constants as they are now (tests lower them)."""
    return Limits(HEADER_TIMEOUT, KEEPALIVE_TIMEOUT, DRAIN_TIMEOUT, MAX_LINE, MAX_HEAD_BYTES, MAX_FIELDS,
                  MAX_PIPELINED)

# llhttp's reason (lower case) -> what the client is told; the first key found in the reason wins.
_PARSE_ERRORS = (
    ("chunk", "malformed chunked body"),
    ("content-length", "malformed or conflicting Content-Length"),
    ("transfer-encoding", "malformed or conflicting Transfer-Encoding"),
    ("version", "malformed request line (HTTP/1.x with CRLF line endings expected)"),
    ("crlf", "malformed request line or header block (CRLF line endings expected)"),
    (" lf", "malformed request line or header block (CRLF line endings expected)"),
    (" cr", "malformed request line or header block (CRLF line endings expected)"),
    ("header", "malformed header"),
    ("http/", "malformed request line (HTTP/1.x with CRLF line endings expected)"),
    ("url", "malformed request target"),
)
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_REASONS = {status.value: status.phrase for status in HTTPStatus}
_NO_BODY_STATUS = frozenset({204, 304})


def parse_error_text(exc: Exception) -> str:
    """A fixed description of a parse error: what llhttp says names its own states, not the client's."""
    if isinstance(exc, _RefusedError):
        return exc.text
    context = exc.__context__
    if isinstance(exc, httptools.HttpParserCallbackError) and isinstance(context, _RefusedError):
        return context.text
    if isinstance(exc, httptools.HttpParserInvalidMethodError):
        return "malformed request method"
    if isinstance(exc, httptools.HttpParserInvalidURLError):
        return "malformed request target"
    reason = str(exc).lower()
    return next((text for key, text in _PARSE_ERRORS if key in reason), "malformed HTTP request")


class _RefusedError(Exception):
    """Raised in a parser callback: the request breaks a limit of this server."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


class Body:
    """A request body as it arrives; `readany()` hands out what is here, b"" at its end."""

    __slots__ = ("_chunks", "_conn", "_discard", "_error", "_size", "_waiter", "complete")

    def __init__(self, conn: HttpConnection) -> None:
        self._conn = conn
        self._chunks: deque[bytes] = deque()
        self._size = 0  # bytes held
        self._waiter: asyncio.Future[None] | None = None
        self._error: BaseException | None = None
        self._discard = False  # draining: what arrives is dropped
        self.complete = False  # every byte arrived (the parser saw the message's end)

    def feed(self, data: bytes) -> None:
        if not self._discard:
            self._chunks.append(data)
            self._size += len(data)
        wake(self._waiter)

    def feed_eof(self) -> None:
        self.complete = True
        wake(self._waiter)

    def fail(self, exc: BaseException) -> None:
        if not self.complete:
            self._error = exc
            wake(self._waiter)

    @property
    def over_high_water(self) -> bool:
        return self._size > HIGH_WATER

    def whole(self) -> bytes | None:
        """Every byte of a body that has arrived whole, taken (`unread` puts it back); else None."""
        if not self.complete or self._error is not None or self._discard or len(self._chunks) != 1:
            return None
        data = self._chunks.popleft()
        self._size = 0
        return data

    def unread(self, data: bytes | None) -> None:
        """Put back what `whole` took."""
        if data is not None:
            self._chunks.appendleft(data)
            self._size += len(data)

    async def readany(self) -> bytes:
        """The next bytes of the body; b"" once it ended; IncompleteBodyError when it cannot end."""
        while not self._chunks:
            if self._error is not None:
                raise self._error
            if self.complete:
                return b""
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        data = self._chunks.popleft()
        paused = self.over_high_water
        self._size -= len(data)
        if paused and not self.over_high_water:
            self._conn.flow()
        return data

    async def drain(self) -> None:
        """Drop the rest of the body as it arrives; IncompleteBodyError (or a timeout) when it does not end."""
        self._discard = True
        self._chunks.clear()
        self._size = 0
        self._conn.flow()
        while await self.readany():
            pass


class Request:
    """One request as it came: the method, the raw target, the version ("1.1", "1.0"), the header
    fields as (name, value) pairs in arrival order (values decoded as UTF-8, undecodable bytes kept
    as surrogates), the peer's address, and the body (a stream)."""

    __slots__ = ("_conn", "_continued", "_index", "_stream", "body", "content_length", "expect_continue", "has_body",
                 "headers", "keep_alive", "method", "remote", "target", "transport", "upgrade", "version")

    def __init__(self, conn: HttpConnection, method: str, target: str, version: str,
                 headers: list[tuple[str, str]], index: dict[str, str], *, keep_alive: bool, upgrade: bool) -> None:
        self._conn = conn
        self.method = method
        self.target = target
        self.version = version
        self.headers = headers
        self._index = index  # lower-case name -> the first value
        length = index.get("content-length")
        self.content_length = int(length) if length is not None else None  # llhttp checked it: digits
        self.has_body = bool(self.content_length) or "transfer-encoding" in index
        self.expect_continue = index.get("expect", "").lower() == "100-continue" and version != "1.0"
        self.keep_alive = keep_alive
        self.upgrade = upgrade
        self.remote = conn.remote
        self.transport: asyncio.Transport = conn.transport  # type: ignore[assignment]  # set: connection_made ran
        self.body = Body(conn)
        self._continued = False
        self._stream: StreamResponse | None = None

    def header(self, name: str) -> str | None:
        """The first value of a header field, its name matched case-insensitively."""
        return self._index.get(name.lower())

    def joined(self, name: str) -> str | None:
        """Every value of a header field, joined by "," into one (RFC 9110, 5.3), its name matched
        case-insensitively: what a WSGI environment holds for it."""
        if len(self._index) == len(self.headers):  # no name came twice
            return self._index.get(name.lower())
        lower = name.lower()
        values = [value for field, value in self.headers if field.lower() == lower]
        return ",".join(values) if values else None

    def send_continue(self) -> None:
        """Answer `Expect: 100-continue` (once), when the handler is about to read the body."""
        if self.expect_continue and not self._continued:
            self._continued = True
            if not self.transport.is_closing():
                self.transport.write(_CONTINUE)

    @property
    def continue_unanswered(self) -> bool:
        return self.expect_continue and not self._continued

    def stream(self, status: int, reason: str | None, headers: list[tuple[str, str]],
               length: int | None = None) -> StreamResponse:
        """A response whose body is written piece by piece (`length`: its Content-Length, else chunked)."""
        self._stream = StreamResponse(self._conn, self, status, reason, headers, length)
        return self._stream


class Response:
    """A response whose body is in memory; `length` overrides the Content-Length (an answer to HEAD)."""

    __slots__ = ("body", "headers", "length", "reason", "status")

    def __init__(self, status: int = 200, body: bytes = b"", headers: Sequence[tuple[str, str]] = (), *,
                 reason: str | None = None, length: int | None = None) -> None:
        self.status = status
        self.body = body
        self.headers = headers
        self.reason = reason
        self.length = length


_date: list[Any] = [0, b""]  # the second, and its Date value


def _head(version: str, status: int, reason: str | None, headers: Sequence[tuple[str, str]], length: int | None,
          *, chunked: bool, keep_alive: bool, server: str = "fleetllm-gateway") -> bytes:
    """The status line and header block, with Content-Length (or chunked), Connection, Server, Date and a
    default Content-Type added where needed."""
    now = int(time.time())
    if _date[0] != now:
        _date[:] = [now, format_date_time(now).encode()]
    lines = [f"HTTP/{'1.0' if version == '1.0' else '1.1'} {status} {reason or _REASONS.get(status, '')}\r\n"]
    has_type = has_server = has_date = False
    for name, value in headers:
        lower = name.lower()
        if lower == "content-type":
            has_type = True
        elif lower == "server":
            has_server = True
        elif lower == "date":
            has_date = True
        lines.append(f"{name}: {value}\r\n")
    if status < 200 or status in _NO_BODY_STATUS:
        if length is not None and status == 304:
            lines.append(f"Content-Length: {length}\r\n")
    else:
        if chunked:
            lines.append("Transfer-Encoding: chunked\r\n")
        elif length is not None:
            lines.append(f"Content-Length: {length}\r\n")
        if not has_type and (chunked or length):
            lines.append("Content-Type: application/octet-stream\r\n")
    if not keep_alive:
        lines.append("Connection: close\r\n")
    elif version == "1.0":
        lines.append("Connection: keep-alive\r\n")
    if not has_server:
        lines.append(f"Server: {server}\r\n")
    head = "".join(lines).encode("utf-8", "surrogateescape")
    return head + b"Date: " + _date[1] + b"\r\n\r\n" if not has_date else head + b"\r\n"


class StreamResponse:
    """A response written as its body comes. Its head is held back until the first write, and goes out
    in the same write as the first chunk (an SSE stream's first event is one segment with the head);
    `write(b"")` sends the head alone. Chunked unless its length is known; an HTTP/1.0 client gets the
    body as is and the connection closes after it."""

    __slots__ = ("_chunked", "_conn", "_head", "_no_body", "_request", "finished", "length", "sent", "whole")

    def __init__(self, conn: HttpConnection, request: Request, status: int, reason: str | None,
                 headers: list[tuple[str, str]], length: int | None) -> None:
        self._conn = conn
        self._request = request
        self._no_body = request.method == "HEAD" or status < 200 or status in _NO_BODY_STATUS
        self._chunked = length is None and request.version != "1.0" and not self._no_body
        if length is None and not self._chunked:
            conn.close_after(request)  # the end of the body is the end of the connection
        self._head = (status, reason, headers)
        self.length = length
        self.sent = False  # the head went out
        self.finished = False  # the body's end went out
        self.whole = False  # every byte of the body was written: the server writes its end (`end_later`)

    def _with_head(self, parts: list[bytes]) -> None:
        if not self.sent:
            self.sent = True
            status, reason, headers = self._head
            parts.append(_head(self._request.version, status, reason, headers, self.length, chunked=self._chunked,
                               keep_alive=self._conn.keeps(self._request), server=self._conn.limits.server))

    async def write(self, data: bytes) -> None:
        parts: list[bytes] = []
        self._with_head(parts)
        if data and not self._no_body:
            if self._chunked:
                parts += (b"%x\r\n" % len(data), data, b"\r\n")
            else:
                parts.append(data)
        if parts:
            conn = self._conn
            conn.send_now(b"".join(parts) if len(parts) > 1 else parts[0])
            if conn._write_paused:
                await conn._writable()

    def end_later(self) -> None:
        """The body is whole: the server writes its end once the handler has returned (and kept its books:
        a client that sends its next request at the end of this answer need not wait for them). A handler
        that returns a response it wrote some of, without this or `write_eof`, has it cut."""
        self.whole = True

    async def write_eof(self) -> None:
        if self.finished:
            return
        self.finished = True
        parts: list[bytes] = []
        self._with_head(parts)
        if self._chunked:
            parts.append(b"0\r\n\r\n")
        if parts:
            await self._conn.send(b"".join(parts))


# A handler returns its answer, or an awaitable of it (an answer ready at once needs no coroutine).
Handler = Callable[[Request], Response | Awaitable[Response | StreamResponse]]


class _Refusal:
    """A malformed request's place in the answer order: a 400 naming `text`, then the connection closes."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


def _where(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "?"
    frame = frames[-1]
    return f"{os.path.basename(frame.filename)}:{frame.lineno}"


class HttpConnection(FlowControl):
    """One client connection (asyncio protocol): parses requests, answers them in order."""

    __slots__ = ("_answering", "_closed", "_fields", "_head_bytes", "_head_size", "_head_started", "_header_timeout",
                 "_headers", "_idle_since", "_index", "_loop", "_parser", "_parsing", "_queue", "_raw_left",
                 "_reading_done", "_reading_paused", "_requests", "_server", "_timer", "_url", "_waiting", "_worker",
                 "limits", "remote", "transport")
    __deletable__ = ("_parser",)  # connection_lost deletes it: compiled code (native.py) lets only these go

    def __init__(self, server: HttpServer) -> None:
        super().__init__()
        self._server = server
        self._loop = server.loop
        self.limits = limits = server.limits
        jitter = limits.header_jitter * random.random() if limits.header_jitter else 0.0  # noqa: S311
        self._header_timeout = limits.header_timeout * (1 - jitter)
        self._parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.remote = ""
        self._url = b""
        self._headers: list[tuple[str, str]] = []
        self._index: dict[str, str] = {}
        self._fields = 0
        self._head_bytes = 0  # bytes received while the current header block is incomplete
        self._head_size = 0  # bytes of the current header block parsed
        self._head_started: float | None = None  # when the header block being read began (None: none is)
        self._idle_since = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._parsing: Request | None = None  # the request whose body is arriving
        self._queue: deque[Request | _Refusal] = deque()  # parsed, waiting for their turn
        self._answering = False  # a request is being answered
        self._worker: asyncio.Task[None] | None = None  # the answering task (_answer_all), from the first request
        self._waiting: asyncio.Future[None] | None = None  # its wait for a next request
        self._requests = 0  # header blocks parsed
        self._reading_paused = False
        self._reading_done = False  # nothing more is parsed (a refusal, an upgrade, the peer's EOF)
        self._raw_left = 0  # body bytes of an upgrade request still to come, unparsed
        self._closed = False

    # --- asyncio.Protocol ------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not asyncio.Transport subclasses
        peer = transport.get_extra_info("peername")
        self.remote = peer[0] if isinstance(peer, tuple) and peer else str(peer or "")
        self._server.connections.add(self)
        self._head_started = self._loop.time()
        self._arm(self._head_started)

    def data_received(self, data: bytes) -> None:
        busy_poll = self._server.busy_poll
        if busy_poll is not None and busy_poll.timing is not None:
            busy_poll.woke()
        if self._reading_done:
            if self._raw_left:
                self._raw_body(data)
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade as exc:
            self._upgraded(data[exc.args[0]:])
        except httptools.HttpParserError as exc:
            self._malformed(exc)
        else:
            if self._head_started is not None:
                self._head_bytes += len(data)
                if self._head_bytes > self.limits.max_head_bytes:
                    self._malformed(_RefusedError(self.limits.head_too_large))
        self._next()
        self.flow()

    # eof_received: the default's None closes the transport. A client that ends its side is taken to have
    # left, as Go's server (LLMhop) and aiohttp's take it: its requests are cancelled (connection_lost).

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._closed:
            del self._parser  # it holds this protocol: freed now, not by the next collection of reference cycles
        self._closed = True
        self._server.connections.discard(self)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._parsing is not None:
            self._parsing.body.fail(IncompleteBodyError("the client closed the connection"))
        self._queue.clear()
        if self._worker is not None:
            self._worker.cancel()  # the client left: stop working for it (slots, upstream connections)
        self._wake_writer()

    # --- httptools callbacks ---------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self._url = b""
        self._headers = []
        self._index = {}
        self._fields = 0
        self._head_size = 0
        if self._head_started is None:
            self._head_started = self._loop.time()
            self._arm(self._head_started)

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._head_size += len(url)
        if len(self._url) > self.limits.max_line:
            raise _RefusedError(self.limits.line_too_long)

    def on_header(self, name: bytes, value: bytes) -> None:
        limits = self.limits
        if len(name) + len(value) + 2 > limits.max_line:
            raise _RefusedError(limits.line_too_long)
        self._fields += 1
        self._head_size += len(name) + len(value) + 4
        if self._fields > limits.max_fields or self._head_size > limits.max_head_bytes:
            raise _RefusedError(limits.head_too_large)
        text = name.decode("latin-1")
        decoded = value.decode("utf-8", "surrogateescape")
        self._headers.append((text, decoded))
        self._index.setdefault(text.lower(), decoded)

    def on_headers_complete(self) -> None:
        parser = self._parser
        request = Request(self, parser.get_method().decode("ascii"), self._url.decode("utf-8", "surrogateescape"),
                          parser.get_http_version(), self._headers, self._index,
                          keep_alive=parser.should_keep_alive(), upgrade=parser.should_upgrade())
        self._parsing = request
        self._queue.append(request)
        self._requests += 1
        self._head_started = None
        self._head_bytes = 0

    def on_body(self, data: bytes) -> None:
        if self._parsing is not None:
            self._parsing.body.feed(data)

    def on_message_complete(self) -> None:
        request = self._parsing
        if request is not None and not request.upgrade:  # an upgrade's body is not llhttp's: _upgraded
            self._parsing = None
            request.body.feed_eof()

    # --- reading ---------------------------------------------------------------------------------
    def _upgraded(self, rest: bytes) -> None:
        """An upgrade request (or CONNECT) parsed: it is answered as a plain one, its body (if it has a
        Content-Length) read as is, and nothing after it."""
        self._reading_done = True
        request = self._parsing
        if request is None:
            return
        self.close_after(request)
        if request.content_length:
            self._raw_left = request.content_length
            self._raw_body(rest)
        elif request.header("transfer-encoding") is not None:
            request.body.fail(IncompleteBodyError("a chunked body with an upgrade is not read"))
            self._parsing = None
        else:
            request.body.feed_eof()
            self._parsing = None

    def _raw_body(self, data: bytes) -> None:
        request = self._parsing
        if request is None:
            return
        data = data[:self._raw_left]
        self._raw_left -= len(data)
        if data:
            request.body.feed(data)
        if not self._raw_left:
            self._parsing = None
            request.body.feed_eof()
        self.flow()

    def _malformed(self, exc: Exception) -> None:
        """A parse error or a broken limit: nothing more is read; the request in progress (if its
        answer started) sees its body fail, else a 400 takes its place in the answer order."""
        what = parse_error_text(exc)
        self._reading_done = True
        self._head_started = None
        self._server.log.info("refused a malformed request",
                              extra={"fields": {"peer": self.remote or "?", "error": what}})
        request, self._parsing = self._parsing, None
        if request is not None and request not in self._queue:
            request.body.fail(IncompleteBodyError(what))
            self.close_after(request)
            return
        if request is not None:
            self._queue.remove(request)
        self._queue.append(_Refusal(what))

    def flow(self) -> None:
        """Pause reading while the arriving body holds more than HIGH_WATER unread bytes or too many
        requests wait; resume once neither holds."""
        transport = self.transport
        if transport is None or self._closed:
            return
        body = self._parsing.body if self._parsing is not None else None
        pause = (body is not None and body.over_high_water) or len(self._queue) > self.limits.max_pipelined
        if pause != self._reading_paused and not transport.is_closing():
            self._reading_paused = pause
            if pause:
                transport.pause_reading()
            else:
                transport.resume_reading()

    # --- timers ----------------------------------------------------------------------------------
    def _arm(self, now: float) -> None:
        """Make sure the timer fires within the header timeout (it is never further out than that)."""
        if self._timer is None and not self._closed:
            self._timer = self._loop.call_at(now + self._header_timeout, self._tick)

    def _tick(self) -> None:
        self._timer = None
        if self._closed:
            return
        now = self._loop.time()
        if self._head_started is not None:
            due = self._head_started + self._header_timeout
            if now >= due:
                self._close()  # no answer, as Go does
            else:
                self._timer = self._loop.call_at(due, self._tick)
            return
        if self._answering or self._queue or self._parsing is not None:
            return  # busy: armed again when the connection waits for its client
        due = self._idle_since + self.limits.keepalive_timeout
        if now >= due:
            self._close()
        else:
            self._timer = self._loop.call_at(min(due, now + self._header_timeout), self._tick)

    # --- answering -------------------------------------------------------------------------------
    def keeps(self, request: Request) -> bool:
        """Whether the connection stays open after this request's answer (when nothing more is read, the
        requests already parsed are answered first)."""
        return request.keep_alive and not self._server.stopping and not (self._reading_done and not self._queue)

    def close_after(self, request: Request) -> None:
        request.keep_alive = False

    def send_now(self, data: bytes) -> None:
        """Write to the client (ConnectionResetError when it left); the caller awaits `_writable()` while
        writing is paused. Not a coroutine: a streamed answer writes once an event."""
        transport = self.transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("the client closed the connection")
        transport.write(data)

    async def send(self, data: bytes) -> None:
        """`send_now`, then wait while writing is paused."""
        self.send_now(data)
        if self._write_paused:
            await self._writable()

    def _next(self) -> None:
        """A request is queued: start the connection's answering task, or wake it."""
        if self._answering or not self._queue or self._closed:
            return
        if self._worker is None:
            self._worker = self._loop.create_task(self._answer_all())
        else:
            wake(self._waiting)

    async def _answer_all(self) -> None:
        """The connection's one answering task: answers the queued requests (or refusals) in order, keeping
        the books around each (busy-polling, the idle timer), then waits for the next, until the connection
        closes. One task a connection, not one a request: with the caches cold, creating and registering a
        task costs 11-21 us more than waking one (docs/benchmarks.md, "Ninth round"). One frame, too: the
        task resumes each frame of its chain whenever the upstream sends something."""
        busy_poll = self._server.busy_poll
        while True:
            item = self._queue.popleft()
            keep = False
            if busy_poll is not None:
                busy_poll.busy += 1
            self._answering = True
            try:
                if isinstance(item, _Refusal):
                    await self._refuse(item.text)
                else:
                    self.flow()
                    keep = await self._respond(item)
            except asyncio.CancelledError:
                return  # the connection was lost
            except OSError:
                keep = False
            finally:
                if isinstance(item, Request):
                    item._stream = None  # the streamed response points back at it: no cycle left for the collector
                self._answering = False
                if busy_poll is not None:
                    busy_poll.busy -= 1
                if not keep:
                    self._close()
            del item  # answered: nothing here keeps it while the connection waits
            if not keep:
                return
            if self._queue:
                self.flow()
                continue
            self._idle_since = self._loop.time()
            self._arm(self._idle_since)
            if busy_poll is not None:
                busy_poll.before_client_wait()
            self._waiting = self._loop.create_future()
            try:
                await self._waiting
            except asyncio.CancelledError:
                return  # the connection was lost
            finally:
                self._waiting = None
            if self._closed or not self._queue:
                return

    async def _respond(self, request: Request) -> bool:
        """Answer one request; whether the connection stays open for the next."""
        try:
            answer = self._server.handler(request)
            response = answer if isinstance(answer, Response) else await answer
        except asyncio.CancelledError:
            raise
        except ConnectionError:  # a write after the client left, before connection_lost cancelled the handler
            self.abort()
            return False
        except Exception as exc:
            stream = request._stream
            cut = stream is not None and stream.sent
            self._server.log.error("the request handler failed: " + ("connection cut" if cut else "answered 500"),
                      extra={"fields": {"error": type(exc).__name__, "where": _where(exc)}})
            if cut:
                self.abort()
                return False
            response = self._server.internal_error
        if isinstance(response, StreamResponse):
            if response.sent and not (response.finished or response.whole):  # returned mid-body: cut it
                self.abort()
                return False
            await response.write_eof()
        else:
            keep = self.keeps(request) and not (request.continue_unanswered and not request.body.complete)
            if not keep:
                request.keep_alive = False
            length = response.length if response.length is not None else \
                None if response.status == 304 else len(response.body)  # a 304 tells no length unless given
            head = _head(request.version, response.status, response.reason, response.headers, length, chunked=False,
                         keep_alive=keep, server=self.limits.server)
            body = response.body
            await self.send(head + body if body and request.method != "HEAD" else head)
        # The rest of an unread body is read and dropped, also before a close: closing on unread bytes
        # sends a reset, which can destroy the answer before the client reads it. Not after an
        # unanswered 100-continue: that client sends no body.
        if not request.body.complete and not request.continue_unanswered:
            try:
                await asyncio.wait_for(request.body.drain(), self.limits.drain_timeout)
            except (asyncio.TimeoutError, ConnectionError):  # noqa: UP041 (Python 3.10's is not TimeoutError)
                return False
        return self.keeps(request)

    async def _refuse(self, text: str) -> None:
        body = f"Bad Request: {text}\n".encode()
        head = _head("1.1", 400, None, [("Content-Type", "text/plain; charset=utf-8")], len(body), chunked=False,
                     keep_alive=False, server=self.limits.server)
        await self.send(head + body)

    def _close(self) -> None:
        self._reading_done = True
        self._queue.clear()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    # --- shutdown --------------------------------------------------------------------------------
    def closable(self, late: bool) -> bool:
        """Whether a stop may close this connection now: it is answering nothing, and either waits for a
        next request on keep-alive or (`late`) had its time to send a first one."""
        if self._answering or self._queue or self._parsing is not None:
            return False
        return late or (self._requests > 0 and self._head_started is None)

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()


class HttpServer:
    """The protocol factory of loop.create_server, and what its connections share."""

    def __init__(self, handler: Handler, loop: asyncio.AbstractEventLoop, limits: Limits | None = None,
                 internal_error: Response | None = None, logger: logging.Logger | None = None,
                 busy_poll: BusyPoll | None = None) -> None:
        self.handler = handler
        self.loop = loop
        self.busy_poll = busy_poll  # fleetllm_gateway.busypoll (the gateway's; none for the control plane)
        self.limits = limits if limits is not None else gateway_limits()
        self.log = logger if logger is not None else log
        self.connections: set[HttpConnection] = set()
        self.stopping = False
        error = errors.INTERNAL_ERROR
        self.internal_error = internal_error if internal_error is not None else \
            Response(error.status, error.body(), [("Content-Type", "application/json")])

    def __call__(self) -> HttpConnection:
        return HttpConnection(self)

    def answering(self) -> int:
        """How many connections are answering a request now."""
        return sum(1 for conn in self.connections if conn._answering)

    async def shutdown(self, servers: Sequence[asyncio.AbstractServer], grace: float,
                       first_request_grace: float) -> None:
        """Stop accepting; close idle keep-alive connections at once; give a connection accepted but
        still without its first request up to `first_request_grace` to send it (one accepted an instant
        before the stop would otherwise lose it: a worker retiring in a reload relies on this); let the
        others finish their request (each then closes) up to `grace`; then cut what is left."""
        for server in servers:
            server.close()
        self.stopping = True
        loop = self.loop
        started = loop.time()
        while self.connections and loop.time() - started < grace:
            late = loop.time() - started >= first_request_grace
            for conn in list(self.connections):
                if conn.closable(late):
                    conn._close()
            await asyncio.sleep(0.01)
        for conn in list(self.connections):
            conn.abort()
        await asyncio.sleep(0)
