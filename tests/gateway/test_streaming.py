"""Conformance group 8: SSE events are relayed one by one as they come (llmhop.md §3)."""

from __future__ import annotations

import itertools
import socket
import time

from tests.gateway.conftest import GatewayProcess
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
