"""A small body already whole when its request is answered takes the handler's fast path (no coroutine
of its own for reading it, finding its model or taking a free slot); everything else takes the general
one. Both hold the same bytes and slots, and give them back."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from typing import Any

import pytest

from fleetllm_gateway.app import Gateway
from fleetllm_gateway.config import parse_config
from fleetllm_gateway.httpserver import Body, Request, Response, StreamResponse
from tests.gateway.conftest import TOKEN, Upstreams, reference_config
from tests.support.gateway_thread import ThreadedHttpServer

pytestmark = pytest.mark.python_modules  # stand-in connections and patched methods: not on a compiled build


class _Conn:
    def flow(self) -> None:
        pass


def _body(*chunks: bytes, complete: bool = True) -> Body:
    body = Body(_Conn())  # type: ignore[arg-type]
    for chunk in chunks:
        body.feed(chunk)
    if complete:
        body.feed_eof()
    return body


def test_a_whole_body_is_taken_at_once_and_can_be_put_back() -> None:
    body = _body(b'{"model":"m"}')
    taken = body.whole()
    assert taken == b'{"model":"m"}'
    assert body.whole() is None  # nothing left to take
    body.unread(taken)
    assert asyncio.run(body.readany()) == b'{"model":"m"}'
    assert asyncio.run(body.readany()) == b""


def test_a_body_not_whole_or_in_pieces_is_left_to_the_general_path() -> None:
    assert _body(b"{", complete=False).whole() is None  # still arriving
    assert _body(b'{"model":', b'"m"}').whole() is None  # two pieces: read as a stream
    failed = _body(b"{", complete=False)
    failed.fail(ConnectionResetError("gone"))
    assert failed.whole() is None
    body = _body(b"{", b"}")
    assert body.whole() is None
    assert asyncio.run(body.readany()) == b"{"  # nothing was taken
    body.unread(None)  # nothing to put back
    assert asyncio.run(body.readany()) == b"}"


def _post(port: int, path: str, body: bytes, *, chunked: bool = False) -> int:
    framing = b"Transfer-Encoding: chunked\r\n" if chunked else b"Content-Length: %d\r\n" % len(body)
    sent = b"%x\r\n%b\r\n0\r\n\r\n" % (len(body), body) if chunked else body
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"POST %b HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer %b\r\n%bConnection: close\r\n\r\n%b"
                     % (path.encode(), TOKEN.encode(), framing, sent))
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    return int(received.split(b" ", 2)[1])


def test_both_paths_answer_alike_and_give_back_what_they_held(upstreams: Upstreams) -> None:
    config = parse_config(json.dumps(reference_config(upstreams, maxConcurrentRequests=4)))
    made: list[Gateway] = []
    general: list[int] = []

    def make_handler() -> Any:
        gateway = Gateway(config)
        buffered = gateway._buffered

        async def counted(request: Request, *args: Any) -> Response | StreamResponse:
            general.append(1)
            return await buffered(request, *args)

        gateway._buffered = counted  # type: ignore[method-assign]
        made.append(gateway)
        return gateway.handle

    with ThreadedHttpServer(make_handler) as server:
        fast = [_post(server.port, "/v1/x", b'{"model":"echo","n":%d}' % n) for n in range(10)]
        assert fast == [200] * 10
        assert not general  # small bodies, whole on arrival: none took the general path
        assert _post(server.port, "/v1/x", b'{"model":"nobody"}') == 404
        assert _post(server.port, "/v1/x", b'{"model":') == 400
        assert _post(server.port, "/v1/x", b'{"model":"dead"}') == 502
        assert not general
        assert _post(server.port, "/v1/x", b'{"model":"echo"}', chunked=True) == 200  # no length: streamed
        assert _post(server.port, "/route/echo/x", b"x" * 100) == 200  # path-routed: its own path
        assert len(general) == 2
        gateway = made[0]
        deadline = time.monotonic() + 10
        while (gateway.budget.held or any(m.limiter.active for m in gateway.models.values())) \
                and time.monotonic() < deadline:
            time.sleep(0.01)
        assert gateway.budget.held == 0
        assert {name: m.limiter.active for name, m in gateway.models.items() if m.limiter.active} == {}


def test_a_streamed_answer_ends_after_its_slot_budget_and_connection_are_given_back(
        upstreams: Upstreams, monkeypatch: Any) -> None:
    """The terminator of a chunked answer goes out after the handler kept its books, so a client that
    sends its next request at once never finds the slot, the body's bytes or the upstream connection
    still held (StreamResponse.end_later)."""
    config = parse_config(json.dumps(reference_config(upstreams, maxConcurrentRequests=4)))
    made: list[Gateway] = []
    seen: list[tuple[int, int, int]] = []  # (slots held, budget bytes held, idle upstream connections)
    write_eof = StreamResponse.write_eof

    async def observed(self: StreamResponse) -> None:
        gateway, model = made[0], made[0].models["echo"]
        seen.append((model.limiter.active, gateway.budget.held, len(model.pool._idle)))
        await write_eof(self)

    monkeypatch.setattr(StreamResponse, "write_eof", observed)

    def make_handler() -> Any:
        made.append(Gateway(config))
        return made[-1].handle

    with ThreadedHttpServer(make_handler) as server, \
            socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        body = b'{"model":"echo"}'
        for _ in range(3):  # one keep-alive connection, as an SSE client's
            sock.sendall(b"POST /hop HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer %b\r\nContent-Length: %d\r\n\r\n%b"
                         % (TOKEN.encode(), len(body), body))
            received = b""
            while not received.endswith(b"0\r\n\r\n"):
                chunk = sock.recv(65536)
                assert chunk, received
                received += chunk
            assert received.startswith(b"HTTP/1.1 200 ") and b"transfer-encoding: chunked" in received.lower()
    assert seen == [(0, 0, 1)] * 3
