"""A proxy in front of LiteLLM's model API that counts the writes passing through it and SIGKILLs a
process right after the k-th one reached LiteLLM, before its answer goes back: the harshest moment
for a reconciler to die (the write took effect, the reconciler never learnt it).

Served by ThreadedServer (its own event loop in a thread); the upstream is the real LiteLLM or any fake of its API.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web


def write_kind(method: str, path: str) -> str | None:
    if method == "POST" and path == "/model/new":
        return "create"
    if method == "POST" and path == "/model/delete":
        return "delete"
    if method == "PATCH" and path.startswith("/model/") and path.endswith("/update"):
        return "update"
    return None


@dataclass
class WriteKiller:
    upstream: str
    kill_at: int | None = None  # SIGKILL `victim` after this many writes
    victim: int | None = None  # a pid
    writes: list[tuple[int | None, str, int]] = field(default_factory=list)  # (victim pid, kind, status)
    killed: bool = False

    def arm(self, kill_at: int | None, victim: int | None) -> None:
        self.kill_at, self.victim, self.killed = kill_at, victim, False

    async def forward(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        # Shielded: when the caller dies, its request still completes upstream and is counted.
        status, data = await asyncio.shield(self._exchange(request.method, request.path, request.path_qs, body,
                                                           request.headers.get("Authorization", ""), self.victim))
        return web.Response(status=status, body=data, content_type="application/json")

    async def _exchange(self, method: str, path: str, path_qs: str, body: bytes, authorization: str,
                        victim: int | None) -> tuple[int, bytes]:
        headers = {"Authorization": authorization, "Content-Type": "application/json"}
        async with aiohttp.ClientSession() as session, session.request(
                method, self.upstream.rstrip("/") + path_qs, data=body or None, headers=headers,
                timeout=aiohttp.ClientTimeout(total=60)) as answer:
            data = await answer.read()
            status = answer.status
        kind = write_kind(method, path)
        if kind is not None:
            self.writes.append((victim, kind, status))
            if self.kill_at is not None and victim and not self.killed and self.count(victim) >= self.kill_at:
                self.killed = True
                os.kill(victim, signal.SIGKILL)  # before the answer goes back: it never learns the write
        return status, data

    def count(self, pid: int | None) -> int:
        return sum(1 for who, _, _ in self.writes if who == pid)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.forward)
        return app


class ThreadedServer:
    """An aiohttp application on an ephemeral loopback port, served by an event loop of its own in a
    thread, so that blocking test code and subprocesses can run beside it."""

    def __init__(self, app: web.Application, on_stop: Callable[[], None] | None = None) -> None:
        self.app = app
        self.on_stop = on_stop  # run in the server's loop before it closes
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _main(self, ready: threading.Event) -> None:
        self._stop = asyncio.Event()
        runner = web.AppRunner(self.app, access_log=None)
        await runner.setup()
        try:
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            self.port = int(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
            ready.set()
            await self._stop.wait()
        finally:
            if self.on_stop is not None:
                self.on_stop()
            await runner.cleanup()

    def __enter__(self) -> ThreadedServer:
        ready = threading.Event()

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            self._loop.run_until_complete(self._main(ready))
            self._loop.close()

        self._thread = threading.Thread(target=run, name="threaded-server", daemon=True)
        self._thread.start()
        if not ready.wait(30):
            raise RuntimeError("the threaded server did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(timeout=15)
