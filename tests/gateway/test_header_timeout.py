"""LLMhop's server gives a request 10 s to send its header block and then closes the connection
without an answer (llmhop.md §3: Go's ReadHeaderTimeout); a slow body, a long answer and an idle
keep-alive connection are not timed. The four connections run side by side, so the test waits
the 10 s once."""

from __future__ import annotations

import concurrent.futures
import socket
import time

from fleetllm_gateway.serve import HEADER_TIMEOUT
from tests.gateway.conftest import GatewayProcess

BODY = b'{"model":"echo"}'
HEAD = b"POST /v1/x HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer tok\r\nContent-Length: %d\r\n"
OUTLAST = HEADER_TIMEOUT + 2.5  # how long the slow body and the idle keep-alive client keep going
# How long a slow header client waits to be closed: the timeout is a floor (never closed before it), and
# a gateway without one never closes; how late a loaded machine fires the timer is not the behaviour.
GIVE_UP = HEADER_TIMEOUT + 10


def _connect(gw: GatewayProcess) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", gw.port), timeout=1.0)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _status_of_answer(sock: socket.socket) -> bytes:
    """Read one answer (the echo's small JSON body, sent with Content-Length) and return its status line."""
    sock.settimeout(10.0)
    data = b""
    while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < _content_length(data):
        chunk = sock.recv(65536)
        assert chunk, f"closed after {data!r}"
        data += chunk
    return data.split(b"\r\n", 1)[0]


def _content_length(data: bytes) -> int:
    head = data.split(b"\r\n\r\n", 1)[0].lower()
    return int(head.split(b"content-length: ", 1)[1].split(b"\r\n", 1)[0])


def _closed_after(sock: socket.socket, trickle: bytes | None) -> tuple[float, bytes, bool]:
    """Send `trickle` (if any) once a second until the gateway closes, or GIVE_UP seconds have passed;
    the seconds it took, what the gateway sent, and whether it closed (False: the test gave up)."""
    started = time.monotonic()
    received = b""
    while time.monotonic() - started < GIVE_UP:
        if trickle is not None:
            try:
                sock.sendall(trickle)
            except OSError:
                return time.monotonic() - started, received, True
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except OSError:
            return time.monotonic() - started, received, True
        if not chunk:
            return time.monotonic() - started, received, True
        received += chunk
    return time.monotonic() - started, received, False


def trickled_headers(gw: GatewayProcess) -> tuple[float, bytes, bool]:
    with _connect(gw) as sock:
        sock.sendall(b"GET /v1/models HTTP/1.1\r\n")
        return _closed_after(sock, b"X-Slow: yes\r\n")


def silent_connection(gw: GatewayProcess) -> tuple[float, bytes, bool]:
    with _connect(gw) as sock:
        return _closed_after(sock, None)


def trickled_body(gw: GatewayProcess) -> bytes:
    with _connect(gw) as sock:
        sock.sendall(HEAD % len(BODY) + b"\r\n")
        pause = OUTLAST / len(BODY)
        for byte in BODY:
            time.sleep(pause)
            sock.sendall(bytes([byte]))
        return _status_of_answer(sock)


def idle_keep_alive(gw: GatewayProcess) -> tuple[bytes, bytes]:
    with _connect(gw) as sock:
        sock.sendall(HEAD % len(BODY) + b"\r\n" + BODY)
        first = _status_of_answer(sock)
        time.sleep(OUTLAST)
        sock.sendall(HEAD % len(BODY) + b"\r\n" + BODY)
        return first, _status_of_answer(sock)


def test_only_a_slow_header_block_is_timed_out(gw: GatewayProcess) -> None:
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        headers = pool.submit(trickled_headers, gw)
        silent = pool.submit(silent_connection, gw)
        body = pool.submit(trickled_body, gw)
        idle = pool.submit(idle_keep_alive, gw)
        for slow_client in (headers, silent):
            seconds, answer, closed = slow_client.result()
            assert closed, f"still open after {seconds:.1f} s"  # the header block is timed out...
            assert answer == b""  # ...closed without an answer
            assert seconds >= HEADER_TIMEOUT - 0.5, seconds  # ...and not before its time
        assert body.result() == b"HTTP/1.1 200 OK"
        assert idle.result() == (b"HTTP/1.1 200 OK", b"HTTP/1.1 200 OK")
    assert gw.request("GET", "/v1/models").status == 200  # the gateway is still serving
