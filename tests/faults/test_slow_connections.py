"""Slow and idle connections against the real `fleetllm serve` (issue 16, finding 1).

1,000 connections are held open from 40 loopback addresses: 900 send nothing, 100 send a request
line and then one header line at a time (a slowloris). With all of them open, /health and a box's
GET /vllm/config still answer, correctly; then every one of them is closed by the server at the
header deadline, long before a trickler could have finished its headers. One address opening more
than max_connections_per_peer gets the extra ones closed at once, the others kept.

Before the fix (gunicorn, one gthread worker of 8 threads) the 8th trickler held the last request
thread and /health timed out.
"""

from __future__ import annotations

import contextlib
import json
import select
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from bench.boot_storm import raise_open_files
from tests.conftest import ROOT
from tests.support.plane import ControlPlane, request

from .conftest import FLEET_KEY, KNOWN_BOX, box_headers, metric, plane_document

IDLE, TRICKLING, ADDRESSES = 900, 100, 40
HEADER_TIMEOUT_S = 3
PER_PEER = 32
TRICKLE_HEADERS = 200  # a header a second: 200 s to finish, were the server to wait


def source(i: int) -> str:
    """One of ADDRESSES hosts, each in a network of its own (one /24 holds at most 4 peers' worth)."""
    return f"127.2.{i % ADDRESSES}.2"


def connect(address: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((address, 0))
    sock.connect(("127.0.0.1", port))
    sock.setblocking(False)
    return sock


@contextmanager
def held(socks: list[socket.socket]) -> Iterator[list[socket.socket]]:
    try:
        yield socks
    finally:
        for s in socks:
            s.close()


def closed_by_server(sock: socket.socket) -> bool:
    """True once the server has closed the connection (EOF or reset); False while it is open. poll, not
    select: in a long test session these 1,000 sockets get descriptors above select's FD_SETSIZE (1024)."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    if not poller.poll(0):
        return False
    try:
        sock.recv(65536)  # EOF, or a 400 before the close: either way the server gave up on it
    except BlockingIOError:
        return False
    except ConnectionResetError:
        pass
    return True


def trickle(socks: list[socket.socket], step: int) -> None:
    for s in socks:
        with contextlib.suppress(OSError):  # closed by the server already
            s.send(b"GET /health HTTP/1.1\r\nHost: x\r\n" if step == 0 else f"X-Slow-{step}: a\r\n".encode())


def test_a_thousand_slow_connections_do_not_stall_the_boxes(tmp_path: Path,
                                                            start_plane: Callable[..., ControlPlane],
                                                            figures: Callable[..., None]) -> None:
    raise_open_files(4 * (IDLE + TRICKLING) + 512)
    plane = start_plane(plane_document(tmp_path, repo_path=ROOT / "fleet-repo-example",
                                       server={"header_timeout_s": HEADER_TIMEOUT_S,
                                               "max_connections_per_peer": PER_PEER}))
    before = plane.memory()
    with held([connect(source(i), plane.port) for i in range(IDLE)]) as idle, \
            held([connect(source(i), plane.port) for i in range(TRICKLING)]) as slow:
        trickle(slow, 0)
        opened = time.monotonic()
        for step in range(1, 3):  # every connection is open and the tricklers are mid-headers
            trickle(slow, step)
            time.sleep(0.2)
        assert not any(closed_by_server(s) for s in idle + slow)

        status, _, body = request(plane.url + "/health", timeout=5)
        assert status == 200
        assert json.loads(body)["status"] == "ok"
        status, headers, body = request(plane.url + "/vllm/config", box_headers(), timeout=5)
        assert status == 200
        assert json.loads(body)["host"] == KNOWN_BOX
        assert headers["X-Fleet-Revision"]
        status, _, _ = request(plane.url + "/vllm/config", box_headers(key="wrong"), timeout=5)
        assert status == 403
        held_mid = plane.memory()

        step = 3
        while step < TRICKLE_HEADERS and not all(closed_by_server(s) for s in idle + slow):
            trickle(slow, step)
            step += 1
            time.sleep(0.25)
        assert all(closed_by_server(s) for s in idle), "idle connections outlived the header deadline"
        assert all(closed_by_server(s) for s in slow), "trickling connections outlived the header deadline"
        assert step < TRICKLE_HEADERS  # closed while still sending headers, not when done
        closed_after_s = time.monotonic() - opened

    status, _, body = request(plane.url + "/vllm/config", box_headers(), timeout=5)
    assert status == 200
    after = plane.memory()
    figures(case="1,000 slow/idle connections", connections_held=IDLE + TRICKLING,
            trickle_headers_sent_before_close=step, closed_after_s=round(closed_after_s, 1),
            rss_before_mib=before.rss_mib, rss_with_connections_mib=held_mid.rss_mib, peak_mib=after.peak_mib)


def test_connections_over_the_per_peer_cap_are_closed_at_once(tmp_path: Path,
                                                              start_plane: Callable[..., ControlPlane],
                                                              figures: Callable[..., None]) -> None:
    plane = start_plane(plane_document(tmp_path, repo_path=ROOT / "fleet-repo-example",
                                       server={"max_connections_per_peer": PER_PEER}))
    with held([connect("127.2.1.9", plane.port) for _ in range(PER_PEER + 20)]) as socks:
        deadline = time.monotonic() + 30
        while sum(closed_by_server(s) for s in socks) < 20 and time.monotonic() < deadline:
            time.sleep(0.05)
        closed = [closed_by_server(s) for s in socks]
        assert sum(closed) == 20, closed
        assert not any(closed[:PER_PEER])  # the first PER_PEER are kept, the extra ones refused
        # the capped peer's kept connections still work; another address is not affected
        socks[0].setblocking(True)
        socks[0].sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert socks[0].recv(65536).startswith(b"HTTP/1.1 200")
        status, _, _ = request(plane.url + "/vllm/config", box_headers(), timeout=5)
        assert status == 200
        metrics = plane.get("/metrics")[2].decode()
    refused = metric(metrics.replace('{reason="per_peer"}', ""), "fleetllm_http_connections_refused_total")
    assert refused == 20
    figures(case="per-peer connection cap", cap=PER_PEER, opened=PER_PEER + 20, refused=int(refused))
    plane.stop()
    logged = plane.log_events("connections refused")
    assert sum(e.get("per_peer", 0) for e in logged) == 20
    assert FLEET_KEY not in plane.log.read_text()


def test_a_listed_network_holds_more_than_the_network_cap_and_an_unlisted_one_does_not(
        tmp_path: Path, start_plane: Callable[..., ControlPlane], figures: Callable[..., None]) -> None:
    """server.network_cap_exempt and max_connections_per_network (a provider's NAT, a boot storm of many
    boxes in one /24): 20 addresses of the listed 127.4.1.0/24 keep 2 connections each (40, over the
    network allowance of 8); the same from the unlisted 127.4.2.0/24 gets 8 in and the other 32 closed at once."""
    plane = start_plane(plane_document(tmp_path, repo_path=ROOT / "fleet-repo-example",
                                       server={"max_connections_per_peer": 2, "max_connections_per_network": 8,
                                               "network_cap_exempt": ["127.4.1.0/24"]}))
    with held([connect(f"127.4.1.{1 + i // 2}", plane.port) for i in range(40)]) as listed, \
            held([connect(f"127.4.2.{1 + i // 2}", plane.port) for i in range(40)]) as unlisted:
        deadline = time.monotonic() + 30
        while sum(closed_by_server(s) for s in unlisted) < 32 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sum(closed_by_server(s) for s in unlisted) == 32
        assert not any(closed_by_server(s) for s in unlisted[:8])  # the first 8 of the network are kept
        assert not any(closed_by_server(s) for s in listed)
        listed[-1].setblocking(True)  # the 40th connection of the listed network is served
        listed[-1].sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert listed[-1].recv(65536).startswith(b"HTTP/1.1 200")
        metrics = plane.get("/metrics")[2].decode()
    refused = metric(metrics.replace('{reason="per_prefix"}', ""), "fleetllm_http_connections_refused_total")
    assert refused == 32
    figures(case="per-network cap, a listed network", allowance=8, listed_open=40, unlisted_open=8,
            refused=int(refused))


def raw(port: int, data: bytes, *, read_timeout: float = 30) -> bytes:
    """Send `data` on a fresh connection and read until the server closes it (or answers and waits)."""
    with socket.create_connection(("127.0.0.1", port), timeout=read_timeout) as sock:
        with contextlib.suppress(OSError):
            sock.sendall(data)
        chunks = []
        with contextlib.suppress(OSError):
            while chunk := sock.recv(65536):
                chunks.append(chunk)
                if b"\r\n\r\n" in b"".join(chunks) and b"Connection: close" not in data:
                    break
        return b"".join(chunks)


def test_malformed_and_oversized_requests_get_an_answer_or_a_close(tmp_path: Path,
                                                                    start_plane: Callable[..., ControlPlane]) -> None:
    plane = start_plane(plane_document(tmp_path, repo_path=ROOT / "fleet-repo-example",
                                       server={"body_buffer_bytes": 1048576}))
    # a Host header with a port that is not a number: 400 (RFC 9112), not a request left hanging
    answer = raw(plane.port, b"GET /health HTTP/1.1\r\nHost: a:b\r\nConnection: close\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 400")
    # a declared body over the transport cap: 400 and closed, before it is read
    answer = raw(plane.port, b"POST /vllm/report HTTP/1.1\r\nHost: x\r\nContent-Length: 5000000\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 400") or answer == b""
    # over 64 KiB and under the cap: the app's own 413 (after the fleet-key check)
    body = b"{" + b" " * 100_000 + b"}"
    headers = "".join(f"{k}: {v}\r\n" for k, v in box_headers().items())
    answer = raw(plane.port, (f"POST /vllm/report HTTP/1.1\r\nHost: x\r\n{headers}Content-Length: {len(body)}\r\n"
                              "Connection: close\r\n\r\n").encode() + body)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    # the budget: while four hosts' large bodies (a quarter each, the most one peer may hold) fill the whole
    # 1 MiB budget, a fifth large body is refused
    with held([connect(f"127.3.{i}.2", plane.port) for i in range(4)]) as holders:
        for holder in holders:
            holder.sendall(b"POST /hooks/push HTTP/1.1\r\nHost: x\r\nContent-Length: 262144\r\n\r\n" + b"x" * 1000)
        time.sleep(0.5)  # the server has read the headers and taken the shares (nothing asserts on time)
        assert not any(closed_by_server(s) for s in holders)
        answer = raw(plane.port, b"POST /hooks/push HTTP/1.1\r\nHost: x\r\nContent-Length: 70000\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 400") or answer == b""
    metrics = plane.get("/metrics")[2].decode()
    # two refusals: the 5,000,000-byte report above (more than one peer's quarter of the budget) and this one
    assert 'fleetllm_http_connections_refused_total{reason="body_budget"} 2.0' in metrics
    status, _, _ = request(plane.url + "/vllm/config", box_headers(), timeout=5)
    assert status == 200
