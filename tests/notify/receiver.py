"""A real notification receiver: an HTTP server on loopback in the test process (aiohttp, on a thread of
its own) that records every POST (path, headers, JSON body) and answers from a script of statuses
(then 200; an entry may be (status, headers), e.g. a Retry-After), optionally after a delay."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.support.write_killer import ThreadedServer


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: Any
    status: int  # what the receiver answered


Answer = int | tuple[int, dict[str, str]]  # a status, or a status with the headers to answer it with


@dataclass
class Receiver:
    script: list[Answer] = field(default_factory=list)  # statuses to answer first, in order; then 200
    delay_s: float = 0.0
    gate: threading.Event | None = None  # when given, every answer waits until it is set
    received: list[Received] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    url: str = ""
    arrived: int = 0  # requests read, answered or not (a held one counts here before `received`)

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        with self._lock:
            self.arrived += 1
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.gate is not None:
            await asyncio.to_thread(self.gate.wait, 60)
        with self._lock:
            answer = self.script.pop(0) if self.script else 200
            status, headers = answer if isinstance(answer, tuple) else (answer, {})
            self.received.append(Received(request.path_qs, dict(request.headers), body, status))
        return web.Response(status=status, text="ok" if status == 200 else "try later", headers=headers)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/{tail:.*}", self.handle)
        return app

    def delivered(self, path: str | None = None) -> list[Received]:
        with self._lock:
            return [r for r in self.received if r.status < 300 and (path is None or r.path == path)]

    def wait_for(self, count: int, path: str | None = None, timeout_s: float = 30.0) -> list[Received]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = self.delivered(path)
            if len(found) >= count:
                return found
            time.sleep(0.05)
        raise AssertionError(f"{count} notification(s) to {path or 'any path'} expected, got "
                             f"{[(r.path, r.body.get('key'), r.body.get('status')) for r in self.received]}")


@contextmanager
def receiving(script: list[Answer] | None = None, delay_s: float = 0.0,
              gate: threading.Event | None = None) -> Iterator[Receiver]:
    receiver = Receiver(list(script or []), delay_s, gate)
    with ThreadedServer(receiver.app()) as server:
        receiver.url = server.url
        try:
            yield receiver
        finally:
            if gate is not None:
                gate.set()  # let held answers go, so the server can stop
