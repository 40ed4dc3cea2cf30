"""The gateway's HTTP server (fleetllm_gateway.httpserver) with any handler, on an ephemeral loopback port,
served by an event loop of its own in a thread: blocking test code talks to it over real sockets."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

from fleetllm_gateway.httpserver import Handler, HttpServer


class ThreadedHttpServer:
    """`make_handler()` runs in the server's loop (a handler may hold loop-bound objects); `on_stop` too,
    before the server closes."""

    def __init__(self, make_handler: Callable[[], Handler], on_stop: Callable[[], None] | None = None) -> None:
        self.make_handler = make_handler
        self.on_stop = on_stop
        self.port = 0
        self.http: HttpServer | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None

    async def _main(self, ready: threading.Event) -> None:
        self._stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        self.http = HttpServer(self.make_handler(), loop)
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
        ready = threading.Event()

        def run() -> None:
            self.loop = asyncio.new_event_loop()
            self.loop.run_until_complete(self._main(ready))
            self.loop.close()

        self._thread = threading.Thread(target=run, name="threaded-http-server", daemon=True)
        self._thread.start()
        if not ready.wait(30):
            raise RuntimeError("the threaded server did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.loop is not None and self._stop is not None:
            self.loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(timeout=15)
