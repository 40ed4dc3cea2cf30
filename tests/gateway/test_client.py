"""The upstream client against scripted upstreams on real sockets: framing, keep-alive, failures."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import pytest

from fleetllm_gateway.client import Pool, UpstreamError
from fleetllm_gateway.target import Target

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
HEAD = b"GET / HTTP/1.1\r\nHost: t\r\n\r\n"


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    return await reader.readuntil(b"\r\n\r\n")


async def _with_upstream(script: Script, test: Callable[[Pool], Awaitable[None]], idle_timeout: float = 4.0) -> int:
    """Run `test` against a TCP server answering each connection with `script`; return the connection count."""
    connections = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        try:
            await script(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pool = Pool(Target("http", "127.0.0.1", port), max_idle=4, connect_timeout=5, idle_timeout=idle_timeout)
    try:
        await test(pool)
    finally:
        pool.close()
        server.close()
        await server.wait_closed()
    return connections


def _run(script: Script, test: Callable[[Pool], Awaitable[None]], idle_timeout: float = 4.0) -> int:
    return asyncio.run(asyncio.wait_for(_with_upstream(script, test, idle_timeout), 20))


def _serve_until_eof(closed: list[int]) -> Script:
    """An upstream that answers every request on a connection and never closes one itself: it counts, in
    `closed`, each connection the gateway closed."""

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while await reader.readuntil(b"\r\n\r\n"):
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        finally:
            closed.append(1)

    return script


async def _closed_by_then(closed: list[int], count: int) -> None:
    """Wait (5 s at most) until the upstream has seen `count` connections closed."""
    for _ in range(500):
        if len(closed) >= count:
            return
        await asyncio.sleep(0.01)


def test_idle_connections_are_closed_when_they_expire_without_another_request() -> None:
    closed: list[int] = []

    async def test(pool: Pool) -> None:
        responses = [await pool.send(HEAD, None, chunked=False, head_request=False) for _ in range(3)]
        for response in responses:  # three connections at once, then all three idle
            assert await response.read_all() == b"ok"
            response.release()
        await _closed_by_then(closed, 3)  # no request comes: only the pool's timer can close them
        assert len(closed) == 3

    assert _run(_serve_until_eof(closed), test, idle_timeout=0.05) == 3


def test_the_expiry_timer_spares_connections_in_use_and_reused_ones() -> None:
    closed: list[int] = []

    async def test(pool: Pool) -> None:
        first = await pool.send(HEAD, None, chunked=False, head_request=False)
        assert await first.read_all() == b"ok"
        first.release()  # idle: the timer is armed
        second = await pool.send(HEAD, None, chunked=False, head_request=False)  # the same connection, reused
        await asyncio.sleep(1.2)  # past the first expiry: the connection is in use, not idle
        assert closed == []
        assert await second.read_all() == b"ok"
        second.release()
        third = await pool.send(HEAD, None, chunked=False, head_request=False)  # reused again, not expired
        assert await third.read_all() == b"ok"
        third.release()
        await _closed_by_then(closed, 1)
        assert closed == [1]

    assert _run(_serve_until_eof(closed), test, idle_timeout=0.5) == 1


def test_the_expiry_closes_only_what_expired_and_comes_back_for_the_rest() -> None:
    closed: list[int] = []

    async def test(pool: Pool) -> None:
        responses = [await pool.send(HEAD, None, chunked=False, head_request=False) for _ in range(2)]
        for response in responses:
            assert await response.read_all() == b"ok"
            response.release()
        older, newer = pool._idle
        now = time.monotonic()
        older.idle_since = now - 61  # idle for longer than the pool's 60 s
        newer.idle_since = now - 50  # 10 s left
        pool._expire()  # what its timer runs
        assert pool._idle == [newer]
        assert pool._expiry is not None  # armed again, for when the newer one expires
        assert 0 < pool._expiry.when() - asyncio.get_running_loop().time() <= 10.5
        await _closed_by_then(closed, 1)
        assert closed == [1]
        again = await pool.send(HEAD, None, chunked=False, head_request=False)  # the newer one, reused
        assert await again.read_all() == b"ok"
        again.release()

    assert _run(_serve_until_eof(closed), test, idle_timeout=60) == 2


def test_keep_alive_reuses_one_connection() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await _read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    async def test(pool: Pool) -> None:
        for _ in range(5):
            response = await pool.send(HEAD, None, chunked=False, head_request=False)
            assert (response.status, await response.read_all()) == (200, b"ok")
            response.release()

    assert _run(script, test) == 1


def test_chunked_body_is_dechunked_piece_by_piece_and_trailers_dropped() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n")
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(b"1\r\n!\r\n0\r\nX-Trailer: t\r\n\r\n")
        await asyncio.sleep(1)

    async def test(pool: Pool) -> None:
        response = await pool.send(HEAD, None, chunked=False, head_request=False)
        assert response.streamed
        assert [await response.next_chunk(), await response.next_chunk(), await response.next_chunk()] == [
            b"hello", b"!", b""]
        response.release()

    _run(script, test)


def test_body_until_close_and_interim_responses() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n"
                     b"HTTP/1.0 200 OK\r\nX-A: 1\r\n\r\nall of it")

    async def test(pool: Pool) -> None:
        response = await pool.send(HEAD, None, chunked=False, head_request=False)
        assert (response.status, response.headers) == (200, [("X-A", "1")])
        assert await response.read_all() == b"all of it"
        response.release()

    _run(script, test)


@pytest.mark.parametrize("answer", [
    b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",  # closed mid-body
    b"garbage\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0x5\r\nhello\r\n0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 1, 2\r\n\r\nx",
    b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nBad Header: x\r\nContent-Length: 0\r\n\r\n",  # a space in a name
    b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n folded\r\n\r\n",  # obsolete line folding
    b"HTTP/1.1 200 OK\r\nX-A: 1\nX-B: 2\r\nContent-Length: 0\r\n\r\n",  # a bare LF in a value: no smuggled field
    b"HTTP/1.1 200 OK\r\nX-A: 1\x002\r\nContent-Length: 0\r\n\r\n",  # NUL in a value (RFC 9110, 5.5)
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5 ;x\nz\r\nhello\r\n0\r\n\r\n",  # LF in a size line
    b"",  # closed without answering
])
def test_broken_upstreams_raise_upstream_error(answer: bytes) -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(answer)

    async def exchange(pool: Pool) -> bytes:
        response = await pool.send(HEAD, None, chunked=False, head_request=False)
        return await response.read_all()

    async def test(pool: Pool) -> None:
        with pytest.raises(UpstreamError):
            await exchange(pool)

    _run(script, test)


def test_a_reused_connection_closed_by_the_upstream_is_retried_once() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        # Read the next request, then close without answering (an idle-timeout race).
        await _read_request(reader)

    async def test(pool: Pool) -> None:
        for _ in range(2):
            response = await pool.send(HEAD, b"", chunked=False, head_request=False)
            assert await response.read_all() == b"ok"
            response.release()

    assert _run(script, test) == 2


def test_a_streamed_body_is_never_replayed() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        await _read_request(reader)

    async def body() -> object:
        yield b"abc"

    async def test(pool: Pool) -> None:
        first = await pool.send(HEAD, b"", chunked=False, head_request=False)
        await first.read_all()
        first.release()
        with pytest.raises(UpstreamError):
            await pool.send(HEAD, body(), chunked=True, head_request=False)  # type: ignore[arg-type]

    assert _run(script, test) == 1


def test_chunked_request_framing() -> None:
    received: list[bytes] = []

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        received.append(await reader.readuntil(b"0\r\n\r\n"))
        writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")

    async def body() -> object:
        yield b"abc"
        yield b""
        yield b"0123456789abcdef"

    async def test(pool: Pool) -> None:
        response = await pool.send(HEAD, body(), chunked=True, head_request=False)  # type: ignore[arg-type]
        assert (response.status, await response.read_all()) == (204, b"")
        response.release()

    _run(script, test)
    assert received == [b"3\r\nabc\r\n10\r\n0123456789abcdef\r\n0\r\n\r\n"]


def test_refused_and_unreachable() -> None:
    async def test() -> None:
        pool = Pool(Target("unix", socket_path="/nonexistent/gw.sock"), max_idle=1, connect_timeout=1)
        with pytest.raises(UpstreamError, match="connect failed"):
            await pool.send(HEAD, b"", chunked=False, head_request=False)

    asyncio.run(test())


@pytest.mark.parametrize(("status_line", "connection", "connections"), [
    (b"HTTP/1.0 200 OK", b"", 3),  # HTTP/1.0: one request per connection...
    (b"HTTP/1.0 200 OK", b"Connection: keep-alive\r\n", 1),  # ...unless it says keep-alive
    (b"HTTP/1.1 200 OK", b"Connection: close\r\n", 3),
])
def test_connection_reuse_follows_the_response(status_line: bytes, connection: bytes, connections: int) -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await _read_request(reader)
            # The upstream itself would go on serving: only the client's reading of the answer decides.
            writer.write(status_line + b"\r\nContent-Length: 2\r\n" + connection + b"\r\nok")
            await writer.drain()

    async def test(pool: Pool) -> None:
        for _ in range(3):
            response = await pool.send(HEAD, b"", chunked=False, head_request=False)
            assert await response.read_all() == b"ok"
            response.release()

    assert _run(script, test) == connections
