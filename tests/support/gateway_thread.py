"""The gateway's HTTP server (fleetllm_gateway.httpserver) with any handler, on an ephemeral loopback port,
served by an event loop of its own in a thread (write_killer.ThreadedServer's): blocking test code talks
to it over real sockets."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

from fleetllm_gateway.busypoll import BusyPoll
from fleetllm_gateway.httpserver import Handler, HttpServer
from tests.support.write_killer import ThreadedServer


class ThreadedHttpServer(ThreadedServer):
    """`make_handler()` runs in the server's loop (a handler may hold loop-bound objects); `on_stop` too,
    before the server closes. `busy_poll_us`: the server's busy-polling (fleetllm_gateway.busypoll), none by
    default."""

    def __init__(self, make_handler: Callable[[], Handler], on_stop: Callable[[], None] | None = None,
                 busy_poll_us: int = 0) -> None:
        super().__init__(None, on_stop)  # type: ignore[arg-type]  # no aiohttp application: _main serves
        self.make_handler = make_handler
        self.busy_poll_us = busy_poll_us
        self.http: HttpServer | None = None

    async def _main(self, ready: threading.Event) -> None:
        self._stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        self.http = HttpServer(self.make_handler(), loop, busy_poll=BusyPoll.for_loop(loop, self.busy_poll_us))
        server = await loop.create_server(self.http, "127.0.0.1", 0)
        try:
            self.port = int(server.sockets[0].getsockname()[1])
            ready.set()
            await self._stop.wait()
        finally:
            if self.on_stop is not None:
                self.on_stop()
            await self.http.shutdown([server], 1.0, 0.0)

    def __enter__(self) -> ThreadedHttpServer:
        super().__enter__()
        return self
