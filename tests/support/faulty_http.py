"""Stateful HTTP fakes with faults to switch on and off between (or during) reconcile passes.

- FaultyLitellm: LiteLLM's model API (tests/reconcile/fakes.FakeLitellmHttp, with its observed
  semantics) that can answer slowly, fail its listing, or answer 500 to writes after the first N,
  either before the write takes effect or after it (a lost answer). It counts every write, every
  create of an id that already exists (a duplicate) and every delete.
- FaultyVast: Vast's v1 instances listing (FakeVast: keyset paging, 429s) that can hang, repeat its
  next_token (paging that never advances) or stop after the first page (a truncated listing).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.reconcile.fakes import FakeLitellmHttp, FakeVast

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
WRITES = {("POST", "/model/new"): "create", ("POST", "/model/delete"): "delete"}


def _write_kind(request: web.Request) -> str | None:
    if request.method == "PATCH" and request.path.endswith("/update"):
        return "update"
    return WRITES.get((request.method, request.path))


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "code": str(status)}}, status=status)


@dataclass
class FaultyLitellm(FakeLitellmHttp):
    delay_s: float = 0.0  # every answer waits this long
    fail_listing: bool = False  # GET /v2/model/info answers 500
    writes_allowed: int | None = None  # writes after this many answer 500
    lost_answers: bool = False  # ... after taking effect (True) or before (False)
    log: list[tuple[str, str, int, bool]] = field(default_factory=list)  # (kind, id, status, took effect)
    duplicate_creates: int = 0

    def healthy(self) -> None:
        self.delay_s, self.fail_listing, self.writes_allowed, self.lost_answers = 0.0, False, None, False

    @web.middleware
    async def faults(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        kind = _write_kind(request)
        if kind is None:
            if self.fail_listing and request.path == "/v2/model/info":
                return _error(500, "database connection lost (injected)")
            return await handler(request)
        body: Any = await request.json()
        if kind == "create":
            ident = str(body.get("model_info", {}).get("id"))
        elif kind == "delete":
            ident = str(body.get("id"))
        else:
            ident = request.match_info["ident"]
        if kind == "create" and ident in self.rows:
            self.duplicate_creates += 1
        taken = sum(1 for w in self.log if w[3])
        budget_spent = self.writes_allowed is not None and taken >= self.writes_allowed
        if budget_spent and not self.lost_answers:
            self.log.append((kind, ident, 500, False))
            return _error(500, "write failed (injected)")
        response = await handler(request)
        if budget_spent:
            self.log.append((kind, ident, 500, response.status < 300))
            return _error(500, "no answer after the write (injected)")
        self.log.append((kind, ident, response.status, response.status < 300))
        return response

    def app(self) -> web.Application:
        app = super().app()
        app.middlewares.append(self.faults)
        return app

    def done(self, kind: str) -> list[str]:
        """Ids of the writes of `kind` that took effect (answered or lost)."""
        return [i for k, i, _, done in self.log if k == kind and done]


@dataclass
class FaultyVast(FakeVast):
    hang: bool = False  # every call waits until the client gives up
    repeat_token: bool = False  # next_token never advances
    truncate: bool = False  # next_token is null after the first page: instances beyond it vanish

    async def list(self, request: web.Request) -> web.Response:
        if self.hang:
            await asyncio.sleep(3600)
        response = await super().list(request)
        if response.status != 200 or not (self.repeat_token or self.truncate):
            return response
        body = json.loads(response.body)  # type: ignore[arg-type]
        if self.truncate:
            body["next_token"] = None
        elif body.get("next_token"):
            body["next_token"] = request.query.get("after_token") or body["next_token"]
        return web.json_response(body)

    def healthy(self) -> None:
        self.hang = self.repeat_token = self.truncate = False
        self.throttle = self.calls
