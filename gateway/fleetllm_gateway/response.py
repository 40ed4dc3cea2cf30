"""An upstream's response: its head parsed, its body framed (length, chunked or until close) and handed
out as it arrives, de-chunked, so SSE events pass one by one. Trailers are read and dropped.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from fleetllm_gateway.config import HEADER_NAME
from fleetllm_gateway.connection import Connection, UpstreamError
from fleetllm_gateway.errors import GatewayError

MAX_HEAD_BYTES = 64 * 1024
_NO_BODY_STATUS = frozenset({204, 304})
# A chunk's size line (without its CRLF): the size in hex, whitespace around it, then any extensions,
# none with a CR, LF or NUL (where parsers that take a bare LF for a line's end would disagree).
_CHUNK_LINE = re.compile(rb"[ \t]*([0-9A-Fa-f]{1,16})[ \t]*(?:;[^\r\n\x00]*)?")
# A header line, CRLF included: a token, a colon, and a value of no CR, LF or NUL (RFC 9110, 5.5: a
# recipient rejects them). The whole block must be such lines. Each line matches in one way only, so
# neither pattern backtracks more than a character at a time (whitespace around a value is stripped after).
_FIELD = rf"({HEADER_NAME.pattern}):([^\r\n\x00]*)\r\n"
_FIELDS = re.compile(_FIELD)
_FIELD_BLOCK = re.compile(f"(?:{_FIELD})*")


class StaleError(GatewayError):
    """A reused connection was closed by the upstream before it answered."""


async def read_response(conn: Connection, reuse: Callable[[Connection], None], head_request: bool, *,
                        may_be_stale: bool) -> Response:
    """The first final (non-1xx) response on `conn`; StaleError when a reused one was closed unanswered."""
    while True:
        try:  # conn.read_until, inline: a frame less on the chain the task resumes when the head arrives
            start = 0
            while (head := conn.take_line(b"\r\n\r\n", MAX_HEAD_BYTES, start)) is None:
                start = max(0, len(conn.buffer) - 3)
                await conn.more()
        except UpstreamError:
            if may_be_stale and not conn.received:
                raise StaleError() from None
            raise
        version, status, reason, headers = _parse_head(head)
        if status == 101:
            raise UpstreamError("upstream switched protocols, which the gateway does not support")
        if status >= 200:
            return Response(reuse, conn, status, reason, headers, head_request, http10=version == "HTTP/1.0")
        # 1xx interim responses (100 Continue, 103 Early Hints) are consumed here


def _parse_head(head: bytes) -> tuple[str, int, str, list[tuple[str, str]]]:
    """The status line's parts and the header fields: one match checks every line, one more takes them
    (a loop over the lines cost a call or four a field)."""
    status_line, _, block = head.decode("latin-1").partition("\r\n")
    version, _, rest = status_line.partition(" ")
    code, _, reason = rest.partition(" ")
    if not version.startswith("HTTP/1.") or len(code) != 3 or not code.isdigit():
        raise UpstreamError("upstream sent a malformed status line")
    if not block:
        return version, int(code), reason, []
    block += "\r\n"
    if not _FIELD_BLOCK.fullmatch(block):  # (a name with a space once hung the client, issue 27)
        raise UpstreamError("upstream sent a malformed header line")
    return version, int(code), reason, [(name, value.strip(" \t")) for name, value in _FIELDS.findall(block)]


class Response:
    """A response whose head has arrived; read its body once with `read_all`, `next_chunk` or `chunks`, then
    `release()` the connection (it goes back to the pool only if the body was read to the end)."""

    def __init__(self, reuse: Callable[[Connection], None], conn: Connection, status: int, reason: str,
                 headers: list[tuple[str, str]], head_request: bool, *, http10: bool = False) -> None:
        self.status = status
        self.reason = reason
        self.headers = headers
        self._reuse = reuse
        self._conn: Connection | None = conn
        self._keep_alive = not http10  # HTTP/1.0 keeps a connection only when it says keep-alive
        self.content_length: int | None = None  # bytes of body that follow (None: unknown up front)
        self.declared_length: int | None = None  # a HEAD response's Content-Length, to relay as is
        self._chunked = False
        self._left = 0  # bytes of a body of known length still to hand out
        self._chunk_left = 0  # bytes of the current chunk still to hand out
        self._in_chunks = False  # a chunk's data was read: a CRLF comes before the next size line
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
            self.content_length = self._left = int(next(iter(lengths)))
            self._complete = self.content_length == 0
        else:
            self._until_close = True
        if self._until_close:
            self._keep_alive = False

    @property
    def streamed(self) -> bool:
        """Length unknown up front (chunked or until close), so it must be relayed as it comes."""
        return self.content_length is None

    @property
    def body_arrived(self) -> bool:
        """Some of the body is already here (or there is none to wait for)."""
        return self._complete or self._conn is None or bool(self._conn.buffer)

    def buffered_body(self) -> bytes | None:
        """The whole body of known length when every byte of it is already here (taken, as `read_all`
        would), else None and nothing taken."""
        conn, length = self._conn, self.content_length
        if conn is None or self._complete or length is None or len(conn.buffer) < length:
            return None
        self._complete = True
        return conn.take(length)

    async def read_all(self) -> bytes:
        pieces = []
        while piece := await self.next_chunk():
            pieces.append(piece)
        return b"".join(pieces)

    async def next_chunk(self) -> bytes:
        """The next piece of the body as it arrives (de-chunked: never a chunk's framing), b"" at its end.
        A method, not an async generator: the relay of an SSE stream calls it once an event, and two
        nested generators took some 6 of the 30 us, warm, from the upstream's head to the client's first
        event (docs/benchmarks.md, "Ninth round")."""
        conn = self._conn
        if conn is None or self._complete:
            return b""
        # What is already here is taken without a coroutine (take_line, take): an event usually arrives
        # whole, its framing with it.
        if self._chunked:
            if not self._chunk_left:
                if self._in_chunks:  # the CRLF after a chunk's data
                    end = conn.take_line(b"\r\n", 2)
                    if (end if end is not None else await conn.read_until(b"\r\n", 2)) != b"":
                        raise UpstreamError("upstream sent a malformed chunk")
                self._in_chunks = True
                line = conn.take_line(b"\r\n", 4096)
                if line is None:
                    line = await conn.read_until(b"\r\n", 4096)
                size = _CHUNK_LINE.fullmatch(line)
                if size is None:
                    raise UpstreamError("upstream sent a malformed chunk")
                self._chunk_left = int(size[1], 16)
                if not self._chunk_left:
                    while await conn.read_until(b"\r\n", MAX_HEAD_BYTES):
                        pass  # trailers are not relayed (gateway/README.md)
                    self._complete = True
                    return b""
            data = conn.take(self._chunk_left) if conn.buffer else await conn.read_some(self._chunk_left)
            self._chunk_left -= len(data)
            return data
        if self.content_length is not None:
            data = conn.take(self._left) if conn.buffer else await conn.read_some(self._left)
            self._left -= len(data)
            self._complete = not self._left
            return data
        while not conn.buffer:  # until the upstream closes
            if conn.closed:
                self._complete = True
                return b""
            try:
                await conn.more()
            except UpstreamError:
                self._complete = True
                return b""
        return conn.take(len(conn.buffer))

    def release(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self._complete and self._keep_alive:
            self._reuse(conn)
        else:
            conn.abort()
