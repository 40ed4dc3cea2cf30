"""Busy-polling (fleetllm_gateway.busypoll): the adaptive window, the descriptor it polls on both loops,
when it spins, and the server keeping its count of requests being answered."""

from __future__ import annotations

import asyncio
import os
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import uvloop  # the dev extra's, as the gateway extra's on a box

from fleetllm_gateway import busypoll
from fleetllm_gateway.busypoll import GROW_FROM, BusyPoll, adapt, loop_fd
from fleetllm_gateway.httpserver import Request, Response, StreamResponse
from tests.support.gateway_thread import ThreadedHttpServer

LIMIT = 100e-6


# --- the window ----------------------------------------------------------------------------------
@pytest.mark.parametrize(("window", "waited", "expected"), [
    (0.0, 20e-6, LIMIT * GROW_FROM),  # a closed window opens at GROW_FROM of the limit
    (LIMIT * GROW_FROM, 20e-6, LIMIT * GROW_FROM * 2),  # and doubles on each short wait
    (40e-6, LIMIT, 80e-6),  # a wait of exactly the limit is short
    (80e-6, 1e-6, LIMIT),  # never past the limit
    (LIMIT, 50e-6, LIMIT),
    (LIMIT, LIMIT * 1.01, LIMIT / 2),  # a longer wait halves it
    (LIMIT / 2, 1.0, LIMIT / 4),
    (LIMIT * GROW_FROM * 2, 1.0, LIMIT * GROW_FROM),  # down to GROW_FROM
    (LIMIT * GROW_FROM, 1.0, 0.0),  # and closes below it
    (0.0, 1.0, 0.0),  # a closed window stays closed on long waits
])
def test_the_window_doubles_on_short_waits_and_halves_on_long_ones(window: float, waited: float,
                                                                 expected: float) -> None:
    assert adapt(window, waited, LIMIT) == pytest.approx(expected)


def test_long_waits_close_the_window_and_short_ones_open_it_again() -> None:
    """In front of a vLLM every wait is milliseconds long: after a few the worker no longer spins."""
    window = LIMIT
    for _ in range(4):
        window = adapt(window, 0.02, LIMIT)
    assert window == 0.0
    for _ in range(4):
        window = adapt(window, 10e-6, LIMIT)
    assert window == LIMIT


# --- the descriptor ------------------------------------------------------------------------------
def _ready_after_one_pass(loop: asyncio.AbstractEventLoop) -> tuple[bool, bool]:
    """Whether polling the loop's descriptor sees nothing, then a byte sent to a socket the loop watches."""
    fd = loop_fd(loop)
    assert fd is not None
    assert os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:[eventpoll]"
    watched, peer = socket.socketpair()
    try:
        loop.add_reader(watched, lambda: None)
        loop.run_until_complete(asyncio.sleep(0))  # libuv registers a watcher on its next poll
        poll = select.poll()
        poll.register(fd, select.POLLIN)
        before = bool(poll.poll(0))
        peer.send(b"x")
        after = bool(poll.poll(100))
        loop.remove_reader(watched)
        return before, after
    finally:
        watched.close()
        peer.close()


@pytest.mark.parametrize("make_loop", [asyncio.new_event_loop, uvloop.new_event_loop], ids=["asyncio", "uvloop"])
def test_the_loops_descriptor_sees_its_sockets(make_loop: Callable[[], asyncio.AbstractEventLoop]) -> None:
    loop = make_loop()
    try:
        assert _ready_after_one_pass(loop) == (False, True)
    finally:
        loop.close()


def test_a_loop_without_a_descriptor_or_a_zero_limit_gets_no_busy_polling() -> None:
    class Bare:
        pass

    assert loop_fd(Bare()) is None  # type: ignore[arg-type]
    assert BusyPoll.for_loop(Bare(), 100) is None  # type: ignore[arg-type]
    loop = asyncio.new_event_loop()
    try:
        assert BusyPoll.for_loop(loop, 0) is None
        made = BusyPoll.for_loop(loop, 250)
        assert made is not None and made.client.value == made.upstream.value == pytest.approx(250e-6)
    finally:
        loop.close()


# --- spinning --------------------------------------------------------------------------------------
class Clock:
    """perf_counter for busypoll: each reading is `step` later than the one before."""

    def __init__(self, step: float) -> None:
        self.now = 1000.0
        self.step = step
        self.readings = 0

    def __call__(self) -> float:
        self.now += self.step
        self.readings += 1
        return self.now


@pytest.fixture
def watched() -> Iterator[tuple[BusyPoll, socket.socket]]:
    """A BusyPoll on an epoll watching one socket, and the peer that makes it readable."""
    epoll = select.epoll()
    ours, peer = socket.socketpair()
    epoll.register(ours.fileno(), select.EPOLLIN)
    try:
        yield BusyPoll(epoll.fileno(), LIMIT), peer
    finally:
        epoll.close()
        ours.close()
        peer.close()


def test_a_spin_ends_at_once_when_something_is_ready(watched: tuple[BusyPoll, socket.socket],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    poller, peer = watched
    poller.client.value = LIMIT / 2
    clock = Clock(1e-6)
    monkeypatch.setattr(busypoll, "perf_counter", clock)
    peer.send(b"x")
    poller.before_client_wait()
    assert clock.readings == 2  # the start, and the wait it learnt from: no second poll
    assert poller.timing is None  # nothing slept
    assert poller.client.value == LIMIT  # a short wait: the window doubled
    assert poller.upstream.value == LIMIT  # the other wait's own window is untouched


def test_a_spin_that_catches_nothing_lasts_the_window_then_learns_how_long_the_sleep_was(
        watched: tuple[BusyPoll, socket.socket], monkeypatch: pytest.MonkeyPatch) -> None:
    poller, _ = watched
    clock = Clock(10e-6)
    monkeypatch.setattr(busypoll, "perf_counter", clock)
    started = clock.now + clock.step
    poller.before_upstream_wait()
    assert LIMIT <= clock.now - started <= LIMIT + clock.step + 1e-9  # spun the whole window, and stopped
    assert poller.timing is not None and poller.timing[0] is poller.upstream
    clock.now += 0.05  # the loop slept 50 ms
    poller.woke()
    assert poller.timing is None
    assert poller.upstream.value == LIMIT / 2
    poller.woke()  # bytes without a timed wait: nothing to learn
    assert poller.upstream.value == LIMIT / 2


def test_a_closed_window_sleeps_at_once_and_a_short_sleep_opens_it(watched: tuple[BusyPoll, socket.socket],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    poller, _ = watched
    poller.client.value = 0.0
    clock = Clock(1e-6)
    monkeypatch.setattr(busypoll, "perf_counter", clock)
    poller.before_client_wait()
    assert clock.readings == 1
    assert poller.timing is not None
    poller.woke()
    assert poller.client.value == pytest.approx(LIMIT * GROW_FROM)


@pytest.mark.parametrize(("busy", "client_spins", "upstream_spins"), [(0, True, True), (1, False, True),
                                                                      (2, False, False)])
def test_a_worker_spins_only_when_it_has_nothing_else_to_do(watched: tuple[BusyPoll, socket.socket],
                                                           monkeypatch: pytest.MonkeyPatch, busy: int,
                                                           client_spins: bool, upstream_spins: bool) -> None:
    """The wait for a next request only when no request is being answered; the wait for an upstream's
    answer only when that request is the only one."""
    poller, _ = watched
    poller.busy = busy
    monkeypatch.setattr(busypoll, "perf_counter", Clock(10e-6))
    poller.before_client_wait()
    assert (poller.timing is not None) is client_spins
    poller.timing = None
    poller.before_upstream_wait()
    assert (poller.timing is not None) is upstream_spins


# --- the server ----------------------------------------------------------------------------------
async def _answer(request: Request) -> Response | StreamResponse:
    if request.target == "/slow":
        await asyncio.sleep(0.2)
    while await request.body.readany():
        pass
    return Response(200, b"ok", [("Content-Type", "text/plain")])


def _exchange(port: int, data: bytes, *, until: int = 1) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        received = b""
        while received.count(b"HTTP/1.1 ") < until:
            chunk = sock.recv(65536)
            if not chunk:
                break
            received += chunk
        return received


def test_the_server_counts_the_requests_it_answers_and_the_windows_learn_from_real_waits() -> None:
    """Every request counted while answered and uncounted after, whether answered, pipelined, refused as
    malformed or left by its client halfway; and the client window learns from the sleeps between
    requests (each far longer than the limit, so each halves it)."""
    with ThreadedHttpServer(lambda: _answer, busy_poll_us=100) as server:
        assert server.http is not None and server.http.busy_poll is not None
        poller = server.http.busy_poll
        assert poller.client.value == pytest.approx(LIMIT)
        two = b"GET /a HTTP/1.1\r\nHost: t\r\n\r\nGET /b HTTP/1.1\r\nHost: t\r\n\r\n"
        assert _exchange(server.port, two, until=2).count(b"HTTP/1.1 200") == 2
        assert _exchange(server.port, b"GET /x HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\nok").startswith(
            b"HTTP/1.1 200")
        assert _exchange(server.port, b"NOT HTTP\r\n\r\n").startswith(b"HTTP/1.1 400")
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            sock.sendall(b"GET /slow HTTP/1.1\r\nHost: t\r\n\r\n")
            deadline = time.monotonic() + 10
            while poller.busy == 0 and time.monotonic() < deadline:
                time.sleep(0.005)
            assert poller.busy == 1  # being answered
        deadline = time.monotonic() + 10  # the client left: its request is cancelled
        while poller.busy and time.monotonic() < deadline:
            time.sleep(0.01)
        assert poller.busy == 0

        poller.timing, poller.client.value = None, LIMIT  # the loop is idle: nothing else writes them now
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            windows = []
            for _ in range(3):
                time.sleep(0.05)  # idle far longer than the limit: the next request ends a long wait
                sock.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
                assert sock.recv(65536).startswith(b"HTTP/1.1 200")
                windows.append(poller.client.value)
        # The first request ended an untimed wait; each later one a wait that spun, missed and slept 50 ms.
        assert windows == pytest.approx([LIMIT, LIMIT / 2, LIMIT / 4])


def test_the_flag_is_checked(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text('{"models": {"m": {"url": "http://127.0.0.1:9"}}}')
    for good in ("0", "1000", "100"):
        result = subprocess.run([sys.executable, "-m", "fleetllm_gateway", "--busy-poll", good, "--check", "--config",
                                 str(config)], capture_output=True, text=True, timeout=60)
        assert (result.returncode, result.stderr) == (0, "")
    for bad in ("-1", "1001", "fast"):
        result = subprocess.run([sys.executable, "-m", "fleetllm_gateway", "--busy-poll", bad, "--check"],
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 2
        assert f"expected microseconds from 0 (never) to 1000, got {bad!r}" in result.stderr


def test_the_upstream_window_learns_from_the_waits_for_an_answer() -> None:
    """A pool spins while its request is the only one, and the window learns how long the upstream took
    when its bytes arrive: an upstream answering after 20 ms halves it each time. (The upstream is a
    thread of blocking sockets: on the loop its own socket would end every spin.)"""
    from fleetllm_gateway.client import Pool
    from fleetllm_gateway.target import Target

    listener = socket.create_server(("127.0.0.1", 0))

    def slow() -> None:
        conn, _ = listener.accept()
        with conn:
            received = b""
            while chunk := conn.recv(65536):
                received += chunk
                while b"\r\n\r\n" in received:
                    _, _, received = received.partition(b"\r\n\r\n")
                    time.sleep(0.02)
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    async def main() -> list[float]:
        poller = BusyPoll.for_loop(asyncio.get_running_loop(), 100)
        assert poller is not None
        pool = Pool(Target("http", "127.0.0.1", listener.getsockname()[1]), max_idle=1, connect_timeout=5,
                    busy_poll=poller)
        windows = []
        try:
            for _ in range(3):
                response = await pool.send(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n", None, chunked=False,
                                           head_request=False)
                assert await response.read_all() == b"ok"
                response.release()
                windows.append(poller.upstream.value)
        finally:
            pool.close()
        assert poller.client.value == pytest.approx(LIMIT)  # the other wait's window: untouched
        return windows

    upstream = threading.Thread(target=slow, daemon=True)
    upstream.start()
    try:
        assert asyncio.run(asyncio.wait_for(main(), 20)) == pytest.approx([LIMIT / 2, LIMIT / 4, LIMIT / 8])
    finally:
        listener.close()
        upstream.join(10)
