"""The control plane's HTTP server (fleetllm.server.httpserver.PlaneServer) in front of any WSGI app, on an
ephemeral loopback port, served by an event loop of its own in a thread: blocking test code talks to it
over real sockets."""

from __future__ import annotations

import asyncio
import ssl
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from fleetllm.server.boxloop import BoxLoop
from fleetllm.server.guard import BodyBudget, ConnectionCaps
from fleetllm.server.httpserver import SMALL_BODY, PlaneServer, WsgiApp, connection_limits, listen_on
from fleetllm.settings import Listen
from fleetllm_gateway.httpserver import Request


class _Detached:
    """What a Request needs of its connection, outside a server."""

    def __init__(self, remote: str) -> None:
        self.remote = remote
        self.transport = None


def detached_request(target: str, fields: list[tuple[str, str]], *, method: str = "GET", version: str = "1.1",
                     remote: str = "127.0.0.1") -> Request:
    """A request as the server parses it (each name's first value indexed), with no connection behind it."""
    index: dict[str, str] = {}
    for name, value in fields:
        index.setdefault(name.lower(), value)
    return Request(_Detached(remote), method, target, version, fields, index,  # type: ignore[arg-type]
                   keep_alive=True, upgrade=False)


@contextmanager
def plane_serving(app: WsgiApp, box: Callable[[Executor], BoxLoop | None] = lambda _: None, *,
                  header_timeout_s: float = 10.0, body_timeout_s: float = 10.0, send_timeout_s: float = 10.0,
                  max_header_bytes: int = 65536, per_peer: int = 64, budget: int = 1 << 20,
                  tls: ssl.SSLContext | None = None) -> Iterator[PlaneServer]:
    """The server (its port: `server.local[1]`), stopped as the block ends."""
    loop = asyncio.new_event_loop()
    executor = ThreadPoolExecutor(2)

    async def start() -> tuple[PlaneServer, asyncio.AbstractServer]:
        server = PlaneServer(asyncio.get_running_loop(), app, executor, box(executor),
                             limits=connection_limits(header_timeout_s, max_header_bytes, body_timeout_s),
                             caps=ConnectionCaps(256, per_peer, max(per_peer, 256)),
                             budget=BodyBudget(budget, SMALL_BODY), body_timeout_s=body_timeout_s,
                             send_timeout_s=send_timeout_s, tls=tls)
        return server, await listen_on(server, Listen("127.0.0.1", 0))

    async def stop(server: PlaneServer, listening: asyncio.AbstractServer) -> None:
        await server.shutdown([listening], 1.0, 0.1)

    thread = threading.Thread(target=lambda: (asyncio.set_event_loop(loop), loop.run_forever()), daemon=True)
    thread.start()
    server, listening = asyncio.run_coroutine_threadsafe(start(), loop).result(timeout=10)
    try:
        yield server
    finally:
        asyncio.run_coroutine_threadsafe(stop(server, listening), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        executor.shutdown(wait=True)


def on_loop(server: PlaneServer, call: Callable[[], Any]) -> Any:
    """Run `call` on the server's event loop and return what it returned."""
    async def run() -> Any:
        return call()

    return asyncio.run_coroutine_threadsafe(run(), server.loop).result(timeout=10)
