"""The gateway's HTTP server itself (fleetllm_gateway.httpserver), with handlers of the test's own, over
real sockets: what a connection gets (pipelining, keep-alive, chunked bodies, 100-continue, HEAD,
streamed heads with their first chunk, write back-pressure) and what it is refused (header limits,
malformed HTTP, upgrades, a slow header block, an unread body that does not end, a handler's bug)."""

from __future__ import annotations

import asyncio
import gc
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from fleetllm_gateway import httpserver
from fleetllm_gateway.httpserver import Request, Response, StreamResponse
from tests.support.gateway_thread import ThreadedHttpServer


async def echo(request: Request) -> Response | StreamResponse:
    """Answers with the method, target and body it read; `/slow` waits a little first, `/noread` reads nothing."""
    if request.target.startswith("/slow"):
        await asyncio.sleep(0.1)
    body = b""
    if not request.target.startswith("/noread"):
        request.send_continue()
        while chunk := await request.body.readany():
            body += chunk
    text = f"{request.method} {request.target} {len(body)} ".encode() + body
    return Response(200, text, [("Content-Type", "text/plain")])


@pytest.fixture
def serve() -> Iterator[Callable[..., ThreadedHttpServer]]:
    started: list[ThreadedHttpServer] = []

    def start(handler: Callable[[Request], object] = echo) -> ThreadedHttpServer:
        server = ThreadedHttpServer(lambda: handler)  # type: ignore[arg-type,return-value]
        started.append(server.__enter__())
        return server

    yield start
    for server in started:
        server.__exit__(None, None, None)


def connect(server: ThreadedHttpServer, timeout: float = 10.0) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=timeout)


def read_response(sock: socket.socket, buffered: bytearray) -> tuple[bytes, dict[str, str], bytes]:
    """One response (Content-Length or chunked framing) from `sock`; what follows stays in `buffered`."""
    while b"\r\n\r\n" not in buffered:
        chunk = sock.recv(65536)
        assert chunk, f"closed before a response head: {bytes(buffered)!r}"
        buffered += chunk
    head, _, rest = bytes(buffered).partition(b"\r\n\r\n")
    status, *lines = head.decode("latin-1").split("\r\n")
    headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)}
    buffered[:] = rest
    if "content-length" in headers:
        size = int(headers["content-length"])
        if status.split()[1] in ("204", "304") or headers.get("x-head") == "1":
            size = 0
        while len(buffered) < size:
            chunk = sock.recv(65536)
            assert chunk, "closed within a body"
            buffered += chunk
        body = bytes(buffered[:size])
        del buffered[:size]
        return status.encode(), headers, body
    body = b""
    if headers.get("transfer-encoding") == "chunked":
        while True:
            while b"\r\n" not in buffered:
                buffered += sock.recv(65536)
            line, _, _ = bytes(buffered).partition(b"\r\n")
            size = int(line, 16)
            while len(buffered) < len(line) + 2 + size + 2:
                buffered += sock.recv(65536)
            body += bytes(buffered[len(line) + 2:len(line) + 2 + size])
            del buffered[:len(line) + 2 + size + 2]
            if size == 0:
                return status.encode(), headers, body
    return status.encode(), headers, body


def exchange(server: ThreadedHttpServer, data: bytes) -> bytes:
    """Send `data` on a new connection and read until the server closes it."""
    with connect(server) as sock:
        sock.sendall(data)
        return read_to_close(sock)


def read_to_close(sock: socket.socket) -> bytes:
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk


def test_pipelined_requests_are_answered_in_order(serve: Callable[..., ThreadedHttpServer]) -> None:
    server = serve()
    with connect(server) as sock:
        sock.sendall(b"POST /slow HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n\r\nabc"
                     b"GET /second HTTP/1.1\r\nHost: t\r\n\r\n"
                     b"POST /third HTTP/1.1\r\nHost: t\r\nContent-Length: 1\r\n\r\nz")
        buffered = bytearray()
        bodies = [read_response(sock, buffered)[2] for _ in range(3)]
    assert bodies == [b"POST /slow 3 abc", b"GET /second 0 ", b"POST /third 1 z"]


def test_a_keep_alive_connection_serves_many_requests(serve: Callable[..., ThreadedHttpServer]) -> None:
    server = serve()
    with connect(server) as sock:
        buffered = bytearray()
        for n in range(20):
            sock.sendall(b"POST /n%d HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\nok" % n)
            status, headers, body = read_response(sock, buffered)
            assert (status, body) == (b"HTTP/1.1 200 OK", b"POST /n%d 2 ok" % n)
            assert headers["server"] == "fleetllm-gateway" and "connection" not in headers and "date" in headers


def test_http_1_0_closes_unless_asked_to_keep_alive(serve: Callable[..., ThreadedHttpServer]) -> None:
    server = serve()
    answer = exchange(server, b"GET /a HTTP/1.0\r\n\r\n")
    assert answer.startswith(b"HTTP/1.0 200 OK\r\n") and b"Connection: close\r\n" in answer
    with connect(server) as sock:
        sock.sendall(b"GET /a HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        buffered = bytearray()
        assert read_response(sock, buffered)[1]["connection"] == "keep-alive"
        sock.sendall(b"GET /b HTTP/1.0\r\n\r\n")
        assert read_response(sock, buffered)[2] == b"GET /b 0 "


def test_a_chunked_request_body_is_read_whole(serve: Callable[..., ThreadedHttpServer]) -> None:
    server = serve()
    with connect(server) as sock:
        sock.sendall(b"POST /c HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
        time.sleep(0.05)  # the second chunk in a later segment
        sock.sendall(b"6;ext=1\r\n world\r\n0\r\nTrailer: x\r\n\r\n")
        assert read_response(sock, bytearray())[2] == b"POST /c 11 hello world"


def test_expect_100_continue_is_answered_before_the_body(serve: Callable[..., ThreadedHttpServer]) -> None:
    server = serve()
    with connect(server) as sock:
        sock.sendall(b"POST /e HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n")
        interim = b""
        while b"\r\n\r\n" not in interim:
            interim += sock.recv(65536)
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(b"body")
        assert read_response(sock, bytearray())[2] == b"POST /e 4 body"


def test_an_unanswered_expect_closes_instead_of_waiting_for_the_body(serve: Callable[..., ThreadedHttpServer]) -> None:
    server = serve()
    answer = exchange(server, b"POST /noread HTTP/1.1\r\nHost: t\r\nContent-Length: 99\r\nExpect: 100-continue\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and b"Connection: close\r\n" in answer
    assert b"100 Continue" not in answer


def test_head_gets_the_length_and_no_body(serve: Callable[..., ThreadedHttpServer]) -> None:
    server = serve()
    with connect(server) as sock:
        sock.sendall(b"HEAD /h HTTP/1.1\r\nHost: t\r\n\r\nGET /after HTTP/1.1\r\nHost: t\r\n\r\n")
        time.sleep(0.1)
        data = b""
        while data.count(b"\r\n\r\n") < 2 or not data.endswith(b"GET /after 0 "):
            data += sock.recv(65536)
    head, _, rest = data.partition(b"\r\n\r\n")
    assert b"Content-Length: 10\r\n" in head  # of the body a GET would get, "HEAD /h 0 "
    assert rest.startswith(b"HTTP/1.1 200 OK\r\n")  # the next response follows at once: no body in between


@pytest.mark.parametrize("request_bytes", [
    b"GET / HTTP/1.1\r\nHost: t\r\n" + b"".join(b"X-%d: v\r\n" % n for n in range(1001)) + b"\r\n",
    b"GET / HTTP/1.1\r\nHost: t\r\n" + b"".join(b"X-%d: %s\r\n" % (n, b"v" * 8000) for n in range(140)) + b"\r\n",
    b"GET / HTTP/1.1\r\nHost: t\r\nX-Long: " + b"v" * 8200 + b"\r\n\r\n",
    b"GET /" + b"a" * 8200 + b" HTTP/1.1\r\nHost: t\r\n\r\n",
], ids=["1001-fields", "over-1-MiB", "long-line", "long-target"])
def test_header_limits_get_a_400(serve: Callable[..., ThreadedHttpServer], request_bytes: bytes) -> None:
    server = serve()
    answer = exchange(server, request_bytes)
    assert answer.startswith(b"HTTP/1.1 400 Bad Request\r\n"), answer[:100]
    assert b"\r\n\r\nBad Request: " in answer and (b"too long" in answer or b"too large" in answer)


def test_1000_fields_pass(serve: Callable[..., ThreadedHttpServer]) -> None:
    server = serve()
    with connect(server) as sock:
        sock.sendall(b"GET /many HTTP/1.1\r\n" + b"".join(b"X-%d: v\r\n" % n for n in range(999)) + b"Host: t\r\n\r\n")
        assert read_response(sock, bytearray())[0] == b"HTTP/1.1 200 OK"


def test_a_malformed_request_gets_a_400_text_without_parser_words(serve: Callable[..., ThreadedHttpServer],
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    server = serve()
    caplog.set_level(logging.INFO, "gateway")
    answer = exchange(server, b"POST /x HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nsecret\r\n0\r\n\r\n")
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 Bad Request\r\n") and b"Connection: close" in head
    assert body == b"Bad Request: malformed chunked body\n"
    assert b"Invalid character" not in answer and b"secret" not in answer  # llhttp's words, the client's bytes
    refused = [r for r in caplog.records if r.getMessage() == "refused a malformed request"]
    assert [r.fields for r in refused] == [{"peer": "127.0.0.1", "error": "malformed chunked body"}]  # type: ignore[attr-defined]


def test_a_malformed_request_after_a_good_one_is_refused_in_its_turn(serve: Callable[..., ThreadedHttpServer]) -> None:
    server = serve()
    with connect(server) as sock:
        sock.sendall(b"GET /slow HTTP/1.1\r\nHost: t\r\n\r\nGET / HTTP/9.9\r\n\r\n")
        buffered = bytearray()
        assert read_response(sock, buffered)[2] == b"GET /slow 0 "
        status, _, body = read_response(sock, buffered)
        assert status == b"HTTP/1.1 400 Bad Request" and body.startswith(b"Bad Request: malformed request line")
        assert read_to_close(sock) == b""


@pytest.mark.parametrize("request_bytes", [
    b"GET /up HTTP/1.1\r\nHost: t\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
    b"POST /up HTTP/1.1\r\nHost: t\r\nConnection: Upgrade\r\nUpgrade: h2c\r\nContent-Length: 3\r\n\r\nabc",
    b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n",
], ids=["websocket", "h2c-with-body", "connect"])
def test_an_upgrade_is_answered_plainly_then_the_connection_closes(serve: Callable[..., ThreadedHttpServer],
                                                                   request_bytes: bytes) -> None:
    server = serve()
    answer = exchange(server, request_bytes + b"GET /never HTTP/1.1\r\nHost: t\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and b"Connection: close\r\n" in answer
    assert answer.count(b"HTTP/1.1 ") == 1 and b"/never" not in answer
    assert answer.endswith((b"GET /up 0 ", b"POST /up 3 abc", b"CONNECT example.com:443 0 "))


def test_a_slow_header_block_is_closed_without_an_answer(serve: Callable[..., ThreadedHttpServer],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(httpserver, "HEADER_TIMEOUT", 0.3)
    server = serve()
    with connect(server) as sock:  # a first request that never ends its head
        sock.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n")
        assert read_to_close(sock) == b""
    with connect(server) as sock:  # a second one after a keep-alive answer: its clock starts at its first byte
        sock.sendall(b"GET /a HTTP/1.1\r\nHost: t\r\n\r\n")
        buffered = bytearray()
        assert read_response(sock, buffered)[0] == b"HTTP/1.1 200 OK"
        time.sleep(0.5)  # idle longer than the header timeout: not timed
        sock.sendall(b"GET /b HTTP/1.1\r\n")
        assert read_to_close(sock) == b""


def test_an_unread_body_is_drained_before_the_next_request(serve: Callable[..., ThreadedHttpServer]) -> None:
    server = serve()
    with connect(server) as sock:
        sock.sendall(b"POST /noread HTTP/1.1\r\nHost: t\r\nContent-Length: 600000\r\n\r\n" + b"x" * 1000)
        buffered = bytearray()
        assert read_response(sock, buffered)[2] == b"POST /noread 0 "
        sock.sendall(b"x" * 599_000 + b"GET /next HTTP/1.1\r\nHost: t\r\n\r\n")
        assert read_response(sock, buffered)[2] == b"GET /next 0 "


def test_an_unread_body_that_does_not_end_closes_the_connection(serve: Callable[..., ThreadedHttpServer],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(httpserver, "DRAIN_TIMEOUT", 0.3)
    server = serve()
    answer = exchange(server, b"POST /noread HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\nabc")
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and answer.endswith(b"POST /noread 0 ")


def test_a_handler_bug_is_a_500_and_a_log_line_naming_it(serve: Callable[..., ThreadedHttpServer],
                                                         caplog: pytest.LogCaptureFixture) -> None:
    async def broken(request: Request) -> Response:
        raise KeyError("Bearer secret-in-a-message")

    line = broken.__code__.co_firstlineno + 1
    server = serve(broken)
    caplog.set_level(logging.INFO, "gateway")
    with connect(server) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        status, headers, body = read_response(sock, bytearray())
    assert status == b"HTTP/1.1 500 Internal Server Error"
    assert headers["content-type"] == "application/json" and b"secret" not in body and b"Traceback" not in body
    failed = [r for r in caplog.records if r.getMessage().startswith("the request handler failed")]
    assert [r.fields for r in failed] == [{"error": "KeyError", "where": f"test_http_server.py:{line}"}]  # type: ignore[attr-defined]
    assert all(r.exc_info is None and "secret" not in r.getMessage() for r in caplog.records)


def test_a_streamed_head_goes_out_with_the_first_chunk(serve: Callable[..., ThreadedHttpServer]) -> None:
    release = threading.Event()

    async def sse(request: Request) -> StreamResponse:
        stream = request.stream(200, None, [("Content-Type", "text/event-stream")])
        await stream.write(b"data: 1\n\n")
        while not release.is_set():
            await asyncio.sleep(0.01)
        await stream.write(b"data: 2\n\n")
        await stream.write_eof()
        return stream

    server = serve(sse)
    with connect(server) as sock:
        sock.sendall(b"GET /events HTTP/1.1\r\nHost: t\r\n\r\n")
        first = sock.recv(65536)  # one write: the head and the first event together
        assert first.startswith(b"HTTP/1.1 200 OK\r\n") and b"Transfer-Encoding: chunked\r\n" in first
        assert first.endswith(b"\r\n\r\n9\r\ndata: 1\n\n\r\n")
        release.set()
        buffered = bytearray(first)
        assert read_response(sock, buffered)[2] == b"data: 1\n\ndata: 2\n\n"


@pytest.mark.python_modules  # reads the task's coroutine's __qualname__, which compiled code has not
def test_a_connection_has_one_answering_task_that_ends_with_it(serve: Callable[..., ThreadedHttpServer]) -> None:
    """The requests of a keep-alive connection are answered by one task, which waits between them; when
    the client closes the connection, that task ends (no task is left behind by connections gone)."""
    server = serve()

    def tasks() -> list[str]:
        async def names() -> list[str]:
            return sorted(task.get_coro().__qualname__ for task in asyncio.all_tasks()  # type: ignore[union-attr]
                          if task is not asyncio.current_task())
        return asyncio.run_coroutine_threadsafe(names(), server._loop).result(5)  # type: ignore[arg-type]

    before = tasks()
    with connect(server) as sock:
        buffered = bytearray()
        for n in range(3):
            sock.sendall(b"GET /n%d HTTP/1.1\r\nHost: t\r\n\r\n" % n)
            assert read_response(sock, buffered)[2] == b"GET /n%d 0 " % n
            assert tasks() == sorted([*before, "HttpConnection._answer_all"])
    deadline = time.monotonic() + 10
    while tasks() != before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert tasks() == before


def test_an_answered_request_is_freed_by_reference_counting_alone(serve: Callable[..., ThreadedHttpServer]) -> None:
    """No request leaves a reference cycle behind (a streamed answer and its request once pointed at each
    other): with the cyclic collector off, every request of a keep-alive connection, streamed or not, is
    freed once answered. A cycle a request filled the collector's youngest generation every few dozen
    requests, and each collection cost about 100 us of some request's latency (docs/benchmarks.md)."""
    answered: list[str] = []

    async def handler(request: Request) -> Response | StreamResponse:
        answered.append(request.target)
        if request.target != "/stream":
            return Response(200, b"plain")
        stream = request.stream(200, None, [("Content-Type", "text/event-stream")])
        await stream.write(b"data: 1\n\n")
        await stream.write_eof()
        return stream

    def alive() -> list[str]:  # requests still in memory (Request has __slots__: no weak references)
        return [o.target for o in gc.get_objects() if isinstance(o, Request)]

    server = serve(handler)
    gc.collect()
    gc.disable()
    try:
        with connect(server) as sock:
            buffered = bytearray()
            for target in (b"/stream", b"/plain") * 5:
                sock.sendall(b"GET %b HTTP/1.1\r\nHost: t\r\n\r\n" % target)
                assert read_response(sock, buffered)[0] == b"HTTP/1.1 200 OK"
            deadline = time.monotonic() + 10  # the last answer's task ends just after its last byte went out
            while alive() and time.monotonic() < deadline:
                time.sleep(0.01)
            left = alive()
    finally:
        gc.enable()
    assert len(answered) == 10 and left == []


def test_a_closed_connection_is_freed_by_reference_counting_alone(serve: Callable[..., ThreadedHttpServer]) -> None:
    """A connection and its parser point at each other (llhttp's callbacks are the connection's methods):
    the link is cut when the connection is lost, so with the cyclic collector off, every connection a
    client closed is freed at once, with its transport and task, and not at a later collection."""
    def alive() -> int:  # HttpConnection has __slots__: no weak references
        return sum(1 for o in gc.get_objects() if isinstance(o, httpserver.HttpConnection))

    server = serve()
    gc.collect()
    gc.disable()
    try:
        for _ in range(10):
            with connect(server) as sock:
                sock.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
                assert read_response(sock, bytearray())[0] == b"HTTP/1.1 200 OK"
        deadline = time.monotonic() + 10  # the server sees each close a moment after the client made it
        while alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        left = alive()
    finally:
        gc.enable()
    assert left == 0


def test_a_slow_reader_holds_the_writer_back(serve: Callable[..., ThreadedHttpServer]) -> None:
    written: list[int] = []
    chunk, total = b"y" * 65536, 1024  # 64 MiB if nothing held the handler back

    async def big(request: Request) -> StreamResponse:
        stream = request.stream(200, None, [], length=len(chunk) * total)
        for n in range(total):
            await stream.write(chunk)
            written.append(n)
        await stream.write_eof()
        return stream

    server = serve(big)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    sock.settimeout(10)
    with sock:
        sock.connect(("127.0.0.1", server.port))
        sock.sendall(b"GET /big HTTP/1.1\r\nHost: t\r\n\r\n")
        seen = -1
        while seen != len(written):  # until the handler stops making progress
            seen = len(written)
            time.sleep(0.2)
        assert len(written) < total // 2  # held back: nowhere near 64 MiB buffered
        received = 0
        while received < len(chunk) * total:
            data = sock.recv(1 << 20)
            assert data
            received += len(data)
    assert len(written) == total


def test_a_client_that_leaves_cancels_its_handler(serve: Callable[..., ThreadedHttpServer]) -> None:
    cancelled = threading.Event()
    started = threading.Event()

    async def forever(request: Request) -> Response:
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return Response()

    server = serve(forever)
    with connect(server) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        assert started.wait(10)
    assert cancelled.wait(10)


def test_an_early_answer_reaches_a_client_still_sending_its_body(serve: Callable[..., ThreadedHttpServer]) -> None:
    """The body the handler did not read is read and dropped before the close: a close on unread bytes
    is a reset, which can destroy the answer on its way."""
    server = serve()
    size = 8 << 20
    with connect(server) as sock:
        sock.sendall(b"POST /noread HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % size)
        failed: list[OSError] = []

        def send() -> None:
            try:
                sock.sendall(b"z" * size)
            except OSError as exc:  # a reset: the server closed on unread bytes
                failed.append(exc)

        sender = threading.Thread(target=send)
        sender.start()
        answer = read_to_close(sock)
        sender.join(10)
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and answer.endswith(b"POST /noread 0 ")
    assert failed == []  # every byte was taken
