"""Conformance group 8: SSE events are relayed one by one as they come (llmhop.md §3)."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest

from tests.gateway.conftest import running_gateway


class _SteppedUpstream:
    """An upstream that answers one request with a chunked event stream in steps the test releases
    (`steps`): its head (with the first event when `first_with_head`), then each event, then the end,
    each sent only once released. What reaches the client before a release was relayed, not batched."""

    def __init__(self, events: int, *, first_with_head: bool = False) -> None:
        self.events = events
        self.first_with_head = first_with_head
        self.steps = threading.Semaphore(0)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @staticmethod
    def event(n: int) -> bytes:
        return b'data: {"n": %d}\n\n' % n

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        with conn:
            received = b""
            while b"\r\n\r\n" not in received:
                received += conn.recv(65536)
            chunks = [b"%x\r\n%b\r\n" % (len(self.event(n)), self.event(n)) for n in range(self.events)]
            head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
            if self.first_with_head:
                head += chunks.pop(0)
            conn.sendall(head)
            for chunk in [*chunks, b"0\r\n\r\n"]:
                if not self.steps.acquire(timeout=30):
                    return
                conn.sendall(chunk)

    def close(self) -> None:
        self.steps.release(self.events + 1)
        self.listener.close()


@pytest.mark.parametrize("request_line", [
    b"GET /route/m/sse HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
    b'POST /v1/sse HTTP/1.1\r\nHost: t\r\nContent-Length: 13\r\nConnection: close\r\n\r\n{"model":"m"}',
], ids=["path-routed", "body-routed"])
def test_sse_events_arrive_as_they_are_sent(tmp_path: Path, request_line: bytes) -> None:
    """Each event reaches the client before the upstream sends the next one: relayed one by one as they
    come, never held back to be sent with a later one (no timing involved: the test releases each event
    only once the previous one has arrived)."""
    events = 4
    upstream = _SteppedUpstream(events)
    try:
        config = {"host": "127.0.0.1", "models": {"m": {"url": f"http://127.0.0.1:{upstream.port}"}}}
        with running_gateway(config) as gateway, \
                socket.create_connection(("127.0.0.1", gateway.port), timeout=20) as sock:
            sock.sendall(request_line)
            received = _read_until(sock, b"", b"\r\n\r\n")
            assert received.startswith(b"HTTP/1.1 200")
            assert b"content-type: text/event-stream" in received.lower()
            for n in range(events):
                assert b'"n": %d}' % n not in received
                upstream.steps.release()
                received = _read_until(sock, received, upstream.event(n))
            upstream.steps.release()  # the end
            while chunk := sock.recv(65536):
                received += chunk
        assert received.count(b"data:") == events and received.endswith(b"0\r\n\r\n")
    finally:
        upstream.close()


_FIRST = _SteppedUpstream.event(0)


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
    upstream = _SteppedUpstream(1, first_with_head=together)
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
                upstream.steps.release()
            received = _read_until(sock, received, b"data:")
            upstream.steps.release()
            while chunk := sock.recv(65536):
                received += chunk
        body = received.partition(b"\r\n\r\n")[2]
        assert body == b"%x\r\n%b\r\n0\r\n\r\n" % (len(_FIRST), _FIRST)
    finally:
        upstream.close()
