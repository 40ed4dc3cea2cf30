"""Conformance group 8: SSE events are relayed one by one as they come (llmhop.md §3)."""

from __future__ import annotations

import itertools
import socket
import threading
import time
from pathlib import Path

import pytest

from tests.gateway.conftest import GatewayProcess, running_gateway
from tests.gateway.upstreams import SSE_EVENTS, SSE_INTERVAL


def _event_arrivals(gw: GatewayProcess, request: bytes) -> tuple[bytes, list[float]]:
    arrivals: list[float] = []
    received = b""
    with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as sock:
        started = time.monotonic()
        sock.sendall(request)
        while chunk := sock.recv(65536):
            received += chunk
            arrivals.extend([time.monotonic() - started] * chunk.count(b"data:"))
    return received, arrivals


def test_sse_events_arrive_as_they_are_sent(gw: GatewayProcess) -> None:
    for request in (
            b"GET /route/echo/sse HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer tok\r\nConnection: close\r\n\r\n",
            b'POST /v1/sse HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer tok\r\nContent-Length: 16\r\n'
            b'Connection: close\r\n\r\n{"model":"echo"}'):
        received, arrivals = _event_arrivals(gw, request)
        assert received.startswith(b"HTTP/1.1 200")
        assert b"content-type: text/event-stream" in received.lower()
        assert len(arrivals) == SSE_EVENTS
        # Not batched: the first event is in long before the last one is even sent...
        assert arrivals[0] < SSE_INTERVAL * 0.8
        # ...and each later one comes about one interval after its predecessor.
        for before, after in itertools.pairwise(arrivals):
            assert SSE_INTERVAL * 0.5 < after - before < SSE_INTERVAL * 2.5


class _StagedUpstream:
    """An upstream that answers one request with a chunked event stream in stages the test releases: its
    head (alone, or with the first event when `together`), then the first event, then the end."""

    def __init__(self, *, together: bool) -> None:
        self.together = together
        self.next_stage = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        with conn:
            received = b""
            while b"\r\n\r\n" not in received:
                received += conn.recv(65536)
            head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
            event = b"%x\r\n%b\r\n" % (len(_FIRST), _FIRST)
            if self.together:
                conn.sendall(head + event)
            else:
                conn.sendall(head)
                self.next_stage.wait(30)
                conn.sendall(event)
            self.next_stage.wait(30)
            conn.sendall(b"0\r\n\r\n")

    def close(self) -> None:
        self.next_stage.set()
        self.listener.close()


_FIRST = b'data: {"n": 0}\n\n'


def _read_until(sock: socket.socket, received: bytes, marker: bytes) -> bytes:
    while marker not in received:
        chunk = sock.recv(65536)
        assert chunk, f"the gateway closed before {marker!r}; received {received!r}"
        received += chunk
    return received


@pytest.mark.parametrize("together", [False, True], ids=["head-alone", "head-with-first-event"])
def test_a_streamed_head_is_relayed_without_waiting_for_the_body(tmp_path: Path, together: bool) -> None:
    """The gateway holds a streamed response's head only to send it with a first chunk that came with it:
    a head that arrives alone reaches the client before the upstream has sent any of the body."""
    upstream = _StagedUpstream(together=together)
    try:
        config = {"host": "127.0.0.1", "models": {"m": {"url": f"http://127.0.0.1:{upstream.port}"}}}
        with running_gateway(config) as gateway, \
                socket.create_connection(("127.0.0.1", gateway.port), timeout=20) as sock:
            sock.sendall(b"GET /route/m/sse HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
            received = _read_until(sock, b"", b"\r\n\r\n")
            assert received.startswith(b"HTTP/1.1 200")
            assert b"content-type: text/event-stream" in received.lower()
            if not together:
                assert b"data:" not in received  # the upstream has not sent it yet
                upstream.next_stage.set()
            received = _read_until(sock, received, b"data:")
            upstream.next_stage.set()
            while chunk := sock.recv(65536):
                received += chunk
        body = received.partition(b"\r\n\r\n")[2]
        assert body == b"%x\r\n%b\r\n0\r\n\r\n" % (len(_FIRST), _FIRST)
    finally:
        upstream.close()
