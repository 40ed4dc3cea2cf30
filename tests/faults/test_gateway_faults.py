"""The box gateway under hostile clients (issue 16, findings 6 and 7), as a real process:

- one authenticated request with a huge, token-dense body: the gateway's memory stays near the body's
  size and /health keeps answering while the body is scanned (it used to build the document: a 99 MiB
  body of empty lists took 2.6 GB and held the event loop for 31 s);
- malformed requests and connections closed by the 10 s header deadline: one log line each, no
  traceback, and the bearer they carried in no log line and no answer.
"""

from __future__ import annotations

import concurrent.futures
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetllm_gateway.jsonscan import MAX_BRACKETS
from fleetllm_gateway.serve import HEADER_TIMEOUT
from tests.gateway.conftest import GatewayProcess, running_gateway

SECRET = "gw-faults-bearer-Zq8Lr3Vx6N"


@pytest.fixture(scope="module")
def gateway() -> Iterator[GatewayProcess]:
    # One model whose upstream is never reached: the attacks name another model, or none.
    config = {"host": "127.0.0.1", "authTokens": [SECRET], "models": {"m": {"url": "http://127.0.0.1:9"}}}
    with running_gateway(config) as process:
        yield process


def _status(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data.split(b"\r\n", 1)[0]


def _post(port: int, body: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=120)
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer " + SECRET.encode()
                 + b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    return sock


def _peak_rss_mib(pid: int) -> float:
    line = next(li for li in Path(f"/proc/{pid}/status").read_text().splitlines() if li.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


def test_a_huge_body_of_empty_lists_is_refused_within_its_own_size(gateway: GatewayProcess,
                                                                   figures: Callable[..., None]) -> None:
    assert gateway.proc is not None
    before = _peak_rss_mib(gateway.proc.pid)
    body = b'{"messages": [' + b"[]," * (10 << 20) + b'[]], "model": "absent"}'  # 30 MiB, 10 M lists
    with _post(gateway.port, body) as sock:
        assert _status(sock) == b"HTTP/1.1 413 Request Entity Too Large"
    grown = _peak_rss_mib(gateway.proc.pid) - before
    figures(case="gateway: 30 MiB of empty lists", body_mib=30, peak_rss_growth_mib=round(grown, 1))
    assert grown < 3 * 30  # json.loads built 10 M lists here: about 800 MiB
    assert gateway.request("GET", "/health", token=None).status == 200


def test_health_answers_while_a_large_body_is_scanned(gateway: GatewayProcess, figures: Callable[..., None]) -> None:
    """A body just under the bracket cap, of the shape the scanner is slowest on (about 2 s of CPU):
    /health answers in the meantime, many times."""
    assert gateway.proc is not None
    body = b'{"model": "absent", "x": [' + b"[[[[[[]]]]]]," * (MAX_BRACKETS // 6 - 10) + b"[]]}"
    answered: list[float] = []
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            if gateway.request("GET", "/health", token=None, timeout=60).status == 200:
                answered.append(time.monotonic())
            time.sleep(0.01)

    before = _peak_rss_mib(gateway.proc.pid)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        poller = pool.submit(poll)
        sock = _post(gateway.port, body)
        sent = time.monotonic()
        status = _status(sock)
        finished = time.monotonic()
        sock.close()
        done.set()
        poller.result()
    during = [t for t in answered if sent < t < finished]
    figures(case="gateway: nested body under the bracket cap", body_mib=round(len(body) / 2**20, 2),
            scan_s=round(finished - sent, 2), health_answers_during=len(during),
            peak_rss_growth_mib=round(_peak_rss_mib(gateway.proc.pid) - before, 1))
    assert status == b"HTTP/1.1 404 Not Found"
    assert len(during) >= 3, (len(during), finished - sent)


MALFORMED = [
    b"POST /v1/chat/completions HTTP/1.1\nHost: t\nAuthorization: Bearer %s\nContent-Length: 2\n\n{}",
    b"GET /v1/models HTTP/1.1\r\nAuthorization: Bearer %s\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n",
    b"POST /v1/x HTTP/1.1\r\nAuthorization: Bearer %s\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    b"GET / HTTP/1.1\r\nAuthorization: Bearer %s\r\nHost : x\r\n\r\n",
    b"G\x01T / HTTP/1.1\r\nAuthorization: Bearer %s\r\n\r\n",
]


def _slow(port: int, trickle: bytes | None) -> bytes:
    """A request line and the bearer, then one header a second (or nothing) until the gateway closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nAuthorization: Bearer " + SECRET.encode() + b"\r\n")
        received, started = b"", time.monotonic()
        while time.monotonic() - started < HEADER_TIMEOUT + 8:
            try:
                if trickle is not None:
                    sock.sendall(trickle)
                chunk = sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                break
            if not chunk:
                break
            received += chunk
        return received


def test_bad_clients_leave_one_line_each_and_never_the_bearer(figures: Callable[..., None]) -> None:
    config: dict[str, Any] = {"host": "127.0.0.1", "authTokens": [SECRET], "models": {"m": {"url": "http://127.0.0.1:9"}}}
    with running_gateway(config) as gw, concurrent.futures.ThreadPoolExecutor(2) as pool:
        slow = [pool.submit(_slow, gw.port, b"X-Slow: yes\r\n"), pool.submit(_slow, gw.port, None)]
        answers = [gw.raw(template % SECRET.encode()) for template in MALFORMED]
        closed_without_answer = [future.result() for future in slow]
        gw.stop()
        log = gw.stderr()
    assert closed_without_answer == [b"", b""]
    for answer in answers:
        assert b" 400 " in answer.split(b"\r\n", 1)[0]
        assert SECRET.encode() not in answer
    assert SECRET not in log
    assert "Traceback" not in log
    assert "Error" not in log
    refusals = log.count("refused a malformed request")
    figures(case="gateway: malformed requests and header deadline", requests=len(MALFORMED) + 2,
            log_lines=len(log.splitlines()), refusals_logged=refusals, tracebacks=log.count("Traceback"))
    assert refusals == len(MALFORMED)
