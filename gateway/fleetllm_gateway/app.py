"""The request handler: LLMhop's order of checks (llmhop.md §1-§2), then forwarding through a pool.

    GET|HEAD /health                      no auth, {"status":"ok","models":N}
    (auth, when authTokens is set)        401
    GET|HEAD /v1/models, /v1/models/{m}   answered here, no slot taken
    GET|HEAD /metrics                     answered here (Prometheus text)
    /route/{m}                            307 to /route/{m}/
    declared Content-Length > cap         413, body unread
    /route/{m}/{rest}                     404 unknown model, 503 when its slots and queue are full, else
                                          the body read (413 over the cap, 400 unreadable)
    anything else                         body read (413 over the cap, 400 unreadable), model from the
                                          JSON (400), 404 unknown model
    then per model: a slot (503 when the queue is full or the wait ran out), upstream (502 on failure)

Every body is read whole, under the gateway-wide byte budget, before a model's slot is taken (path-routed
ones too, where LLMhop streams them): a slow or incomplete upload holds bytes it sent, never a slot.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from fleetllm_gateway import errors
from fleetllm_gateway.busypoll import BusyPoll
from fleetllm_gateway.client import Pool, UpstreamError, describe
from fleetllm_gateway.client import Response as UpstreamResponse
from fleetllm_gateway.config import GatewayConfig, ModelRoute
from fleetllm_gateway.errors import BodyError
from fleetllm_gateway.forwarding import (
    PathRoute,
    Redirect,
    bearer_ok,
    client_headers,
    models_api_name,
    parse_route,
    upstream_headers,
)
from fleetllm_gateway.httpserver import Request, Response, StreamResponse
from fleetllm_gateway.jsonscan import find_model, loads_model, small_enough_for_json
from fleetllm_gateway.limiter import Admission, ByteBudget, Limiter
from fleetllm_gateway.metrics import LAST_LOGGED, UNLOGGED, Metrics, ModelStats, Table
from fleetllm_gateway.proxyenv import proxy_for
from fleetllm_gateway.shared import Shared

log = logging.getLogger("gateway")

BUFFER_RESPONSES_UP_TO = 1024 * 1024  # known-length bodies up to this size are relayed in one write
LOG_INTERVAL = 10.0  # seconds between two upstream-failure log lines of one model
BUFFER_REQUESTS_UP_TO = 64 * 1024  # path-routed bodies declared this small are read before forwarding
_JSON = "application/json"
_JSON_HEADERS = (("Content-Type", _JSON),)
_METRICS_HEADERS = (("Content-Type", "text/plain; version=0.0.4; charset=utf-8"),)


class _BodyTooLargeError(Exception):
    pass


class _BodyUnreadableError(Exception):
    pass


class _BudgetExhaustedError(Exception):
    pass


class _Model:
    __slots__ = ("limiter", "pool", "route", "stats")

    def __init__(self, route: ModelRoute, pool: Pool, limiter: Limiter, stats: ModelStats) -> None:
        self.route = route
        self.pool = pool
        self.limiter = limiter
        self.stats = stats

    def log_failure(self, what: str, reason: str) -> None:
        """Log an upstream failure, at most once per LOG_INTERVAL per model (a dead upstream under load
        would otherwise write a line per request), whichever worker saw it; the metrics count every one."""
        cells, at = self.stats.cells, self.stats.common
        now = time.monotonic()
        last = cells[at + LAST_LOGGED]
        if last and now - last < LOG_INTERVAL:
            cells[at + UNLOGGED] += 1
            return
        unlogged = int(cells[at + UNLOGGED])
        cells[at + LAST_LOGGED], cells[at + UNLOGGED] = now, 0
        log.warning("upstream failed", extra={"fields": {"model": self.route.name, "where": what.strip() or None,
                                                         "error": reason, "more_since_last": unlogged}})


def _json_bytes(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


_ERROR_HEADERS = (("Content-Type", _JSON), ("X-Content-Type-Options", "nosniff"))
_RETRY_HEADERS = (*_ERROR_HEADERS, ("Retry-After", "1"))


def error_response(error: errors.ErrorResponse) -> Response:
    return Response(error.status, error.body(), _RETRY_HEADERS if error.status == 503 else _ERROR_HEADERS)


def _reason(reason: str) -> str | None:
    return reason if reason.isascii() and reason.isprintable() else None


class Gateway:
    """Routes for one configuration. Building it touches no socket, so `--check` builds it too."""

    def __init__(self, config: GatewayConfig, *, environ: Mapping[str, str] | None = None,
                 created: int | None = None, shared: Shared | None = None, previous: Gateway | None = None,
                 busy_poll: BusyPoll | None = None) -> None:
        """`environ` supplies the proxy variables (none when omitted, as under --check); a proxy the
        gateway cannot use raises ProxyError. `shared`: what this worker shares with the others (several
        workers). `previous`: the gateway this one replaces in a reload of a single process: its metrics
        keep adding up, and a model whose limits did not change keeps its limiter (slots held stay held).
        `busy_poll`: the worker's (fleetllm_gateway.busypoll), given to every model's pool."""
        self.config = config
        self.tokens = tuple(token.encode() for token in config.auth_tokens)
        limits = [(m.name, m.max_concurrent) for m in config.models]
        if shared is not None:
            self.metrics = Metrics(limits, tables=shared.tables, worker=shared.worker)
        elif previous is not None:
            self.metrics = Metrics(limits, tables=(*previous.metrics.tables, Table(sorted(dict(limits)))))
        else:
            self.metrics = Metrics(limits)
        self.models: dict[str, _Model] = {}
        for m in config.models:
            stats = self.metrics.models[m.name]
            kept = previous.models.get(m.name) if previous is not None else None
            if kept is not None and (kept.limiter.limit, kept.limiter.max_queued, kept.limiter.timeout) == (
                    m.max_concurrent, m.max_queued, config.queue_timeout):
                limiter = kept.limiter
            else:
                limiter = Limiter(m.max_concurrent, m.max_queued, config.queue_timeout,
                                  shared=shared.slots.get(m.name) if shared is not None else None, on_change=stats.live)
            pool = Pool(m.target, max_idle=m.max_concurrent or 64, connect_timeout=config.connect_timeout,
                        proxy=proxy_for(m.target, environ or {}), busy_poll=busy_poll)
            self.models[m.name] = _Model(m, pool, limiter, stats)
        self.budget = ByteBudget(config.max_buffered_bytes, config.queue_timeout,
                                 shared=shared.body_bytes if shared is not None else None)
        self.scanning = asyncio.Lock()  # large bodies are scanned one at a time (gateway/fleetllm_gateway/jsonscan.py)
        created = int(time.time()) if created is None else created
        entries = {name: {"id": name, "object": "model", "created": created, "owned_by": "llmhop"}
                   for name in config.listed}
        self._catalog = _json_bytes({"object": "list", "data": list(entries.values())})
        self._entries = {name: _json_bytes(entry) for name, entry in entries.items()}
        self._health = _json_bytes({"status": "ok", "models": len(entries)})

    def close(self) -> None:
        for model in self.models.values():
            model.pool.close()

    def _unrouted(self, error: errors.ErrorResponse) -> Response:
        self.metrics.count_unrouted(error.status)
        return error_response(error)

    def handle(self, request: Request) -> Response | Awaitable[Response | StreamResponse]:
        """The answer, or what to await for it. A plain function, not a coroutine: what is answered here
        needs none, and a forwarded request's is the coroutine of its exchange (`_proxy`), the only frame
        of the handler that the task resumes each time the upstream sends something."""
        raw_path, _, query = request.target.partition("?")
        if not raw_path.startswith("/") and "://" in raw_path:  # absolute-form target: keep its path
            raw_path = "/" + raw_path.split("://", 1)[1].partition("/")[2]
        method = request.method
        local = method in ("GET", "HEAD")
        if local and raw_path == "/health":
            return Response(200, self._health, _JSON_HEADERS)
        if self.tokens and not bearer_ok(request.header("authorization"), self.tokens):
            return self._unrouted(errors.UNAUTHORIZED)
        if local:
            answer = self._local(raw_path)
            if answer is not None:
                return answer
        route = parse_route(raw_path, query)
        if isinstance(route, Redirect):
            return Response(307, b"", [("Location", route.location)])
        cap = self.config.max_body_bytes
        if cap and request.content_length is not None and request.content_length > cap:
            return self._unrouted(errors.BODY_TOO_LARGE)
        if isinstance(route, PathRoute):
            return self._path_routed(request, route, query)
        # The body is needed before the model (so before a model's slot); the model is found by
        # fleetllm_gateway.jsonscan without building the document.
        body = self._body_now(request)
        if body is None:
            return self._buffered(request, lambda whole: self._route_body(request, raw_path, query, whole),
                                  self._unrouted)
        try:
            return self._route_body(request, raw_path, query, body, held=len(body))
        except BaseException:  # a bug: an error answer follows, and the budget keeps every byte
            self.budget.release(len(body))
            raise

    def _local(self, raw_path: str) -> Response | None:
        if raw_path == "/v1/models":
            return Response(200, self._catalog, _JSON_HEADERS)
        if raw_path == "/metrics":
            return Response(200, self.metrics.render().encode(), _METRICS_HEADERS)
        name = models_api_name(raw_path)
        if name is None:
            return None
        entry = self._entries.get(name)
        return Response(200, entry, _JSON_HEADERS) if entry else error_response(errors.unknown_model(name))

    def _route_body(self, request: Request, raw_path: str, query: str, body: bytes | bytearray,
                    held: int = 0) -> Response | Awaitable[Response | StreamResponse]:
        """Forward a whole body to the model it names; a small one's is found without a coroutine of its
        own. `held`: bytes of the budget this body holds, released once its answer is done."""
        if not small_enough_for_json(body):
            return self._route_large_body(request, raw_path, query, body, held)
        try:
            name = loads_model(body)
        except BodyError as exc:
            self.budget.release(held)
            return self._unrouted(exc.error)
        return self._forward(request, raw_path, query, name, body, held)

    async def _route_large_body(self, request: Request, raw_path: str, query: str, body: bytes | bytearray,
                                held: int) -> Response | StreamResponse:
        """`_route_body` of a body found by the scanner, which lets the loop run."""
        try:
            name = await find_model(body, self.scanning)
        except BaseException as exc:
            self.budget.release(held)
            if isinstance(exc, BodyError):
                return self._unrouted(exc.error)
            raise
        answer = self._forward(request, raw_path, query, name, body, held)
        return answer if isinstance(answer, Response) else await answer

    def _forward(self, request: Request, raw_path: str, query: str, name: str, body: bytes | bytearray,
                 held: int) -> Response | Awaitable[Response | StreamResponse]:
        model = self.models.get(name)
        if model is None:
            self.budget.release(held)
            return self._unrouted(errors.unknown_model(name))
        return self._proxy(model, request, model.route.target.request_target(raw_path, query), body, held)

    def _path_routed(self, request: Request, route: PathRoute,
                     query: str) -> Response | Awaitable[Response | StreamResponse]:
        """The model is known from the path, yet its slot is taken only once the whole body is here (LLMhop
        streams a path-routed body with the slot held: 12 incomplete chunked uploads held every slot of a
        model until their clients left, issue 27). A model whose slots and queue are full answers 503 at
        once, without waiting for the body."""
        model = self.models.get(route.model)
        if model is None:
            return self._unrouted(errors.unknown_model(route.model))
        target = model.route.target.request_target(route.rest, query)

        def refuse(error: errors.ErrorResponse) -> Response:
            model.stats.count(error.status)
            return error_response(error)

        if model.limiter.full:
            return refuse(errors.QUEUE_FULL)
        if not request.has_body and request.content_length is None:
            return self._proxy(model, request, target, None)
        return self._buffered(request, lambda body: self._proxy(model, request, target, body), refuse)

    def _body_now(self, request: Request) -> bytes | None:
        """The whole body when every byte of it is here already and under the limits, reserved in the
        budget at once (the caller releases it); None otherwise, nothing taken: `_buffered` reads it."""
        length = request.content_length
        if not length or length > BUFFER_REQUESTS_UP_TO:
            return None
        body = request.body.whole()
        if body is None or len(body) != length or not self.budget.take_now(length):
            request.body.unread(body)
            return None
        request.send_continue()
        return body

    async def _buffered(self, request: Request,
                        then: Callable[[bytes | bytearray], Response | Awaitable[Response | StreamResponse]],
                        refuse: Callable[[errors.ErrorResponse], Response]) -> Response | StreamResponse:
        """Read the whole body, then answer with `then(body)`. Each chunk is reserved in the gateway-wide
        ByteBudget before it is kept, and held until the request ends: a client that sends slowly holds
        only what it sent, and never a model's slot."""
        budget, length = self.budget, request.content_length
        if length is not None and not budget.fits(length):
            return refuse(errors.BODY_TOO_LARGE)
        held = [0]  # bytes reserved in the budget, given back when the request ends
        try:
            request.send_continue()
            try:
                body = await self._whole_body(request, self.config.max_body_bytes or budget.total, held)
            except _BudgetExhaustedError:
                return refuse(errors.BODIES_AT_LIMIT)
            except _BodyTooLargeError:
                return refuse(errors.BODY_TOO_LARGE)
            except _BodyUnreadableError:
                return refuse(errors.BODY_UNREADABLE)
            answer = then(body)
            return answer if isinstance(answer, Response) else await answer
        finally:
            budget.release(held[0])

    async def _whole_body(self, request: Request, limit: int, held: list[int]) -> bytes | bytearray:
        """The request body in memory, refused past `limit` (a declared excess was refused earlier). Each
        chunk is reserved in the gateway-wide ByteBudget before it is kept; `held[0]` counts what was.

        A body that arrives in one chunk is kept as it came (no copy); a longer one is filled chunk by
        chunk into one buffer, letting the loop run every MiB (joining whatever is buffered in one call,
        as aiohttp's readexactly() did, held the loop for a third of a second on a 99 MiB body and
        needed twice its size). A body of known length is complete at its last byte: no further read
        waits for the end of the stream."""
        length = request.content_length
        if length == 0:
            return b""
        budget, content = self.budget, request.body
        # Grown as it fills (a large buffer grows in place, by mremap): bytearray(length) would write
        # zeros over all of it first, in one call.
        buffer: bytes | bytearray = b""
        filled = unyielded = 0
        try:
            while chunk := await content.readany():
                size = len(chunk)
                end = filled + size
                if length and end > length:
                    raise _BodyUnreadableError()
                if not length and limit and end > limit:
                    raise _BodyTooLargeError()
                if not budget.take_now(size) and not await budget.acquire(size):
                    raise _BudgetExhaustedError()
                held[0] += size
                if not filled:
                    buffer = chunk
                else:
                    if not isinstance(buffer, bytearray):
                        buffer = bytearray(buffer)
                    buffer += chunk
                filled, unyielded = end, unyielded + size
                if end == length:
                    break
                if unyielded >= 1 << 20:
                    unyielded = 0
                    await asyncio.sleep(0)
        except ConnectionError:  # the client left, or broke the body's framing (errors.IncompleteBodyError)
            raise _BodyUnreadableError() from None
        if length and filled < length:  # the client stopped before the end
            raise _BodyUnreadableError()
        return buffer

    async def _proxy(self, model: _Model, request: Request, target: str, body: bytes | bytearray | None,
                     held: int = 0) -> Response | StreamResponse:
        """Take a slot of the model (the body, if any, is complete by now), then exchange; give back the
        `held` bytes of the budget at the end. One coroutine from the slot to the relay: the task resumes
        every frame of its chain each time the upstream sends something."""
        try:
            stats = model.stats
            admission = Admission.ADMITTED if model.limiter.take_now() else await model.limiter.acquire()
            if admission is not Admission.ADMITTED:
                stats.count(503)
                return error_response(errors.QUEUE_FULL if admission is Admission.QUEUE_FULL
                                      else errors.QUEUE_TIMEOUT)
            clock = time.monotonic  # not the loop's time: uvloop's counts whole milliseconds
            admitted = clock()
            try:
                host, headers = upstream_headers(
                    request.headers, client_ip=request.remote or "", client_host=request.header("host"),
                    strip_authorization=bool(self.tokens), injected=model.route.headers,
                    default_host=model.route.target.authority)
                framing = "" if body is None else f"Content-Length: {len(body)}\r\n"
                pool = model.pool
                lines = [f"{name}: {value}\r\n" for name, value in headers]
                head = (f"{request.method} {pool.absolute_form}{target} HTTP/1.1\r\nHost: {host}\r\n"
                        f"{''.join(lines)}{framing}{pool.proxy_header}\r\n").encode("utf-8", "surrogateescape")
                sent = clock()
                try:
                    upstream = await pool.send(head, body, chunked=False, head_request=request.method == "HEAD")
                except (UpstreamError, OSError) as exc:
                    return self._upstream_failed(model, exc)
                stats.latency.observe(clock() - sent)
                try:
                    return await self._relay(request, model, upstream)
                finally:
                    upstream.release()
            finally:
                model.limiter.release()
                stats.duration.observe(clock() - admitted)
        finally:
            if held:
                self.budget.release(held)

    def _upstream_failed(self, model: _Model, exc: BaseException) -> Response:
        reason = describe(exc)
        model.log_failure("", reason)
        model.stats.upstream_error()
        model.stats.count(502)
        return error_response(errors.upstream_failed(model.route.name, reason))

    async def _relay(self, request: Request, model: _Model, upstream: UpstreamResponse) -> Response | StreamResponse:
        headers = client_headers(upstream.headers)
        status, reason = upstream.status, _reason(upstream.reason)
        length = upstream.content_length
        if length is not None and length <= BUFFER_RESPONSES_UP_TO:
            data = upstream.buffered_body() if length else None  # usually all here with the head: no await
            if data is None and length:
                try:
                    data = await upstream.read_all()
                except UpstreamError as exc:
                    return self._upstream_failed(model, exc)
            model.stats.count(status)
            return Response(status, data or b"", headers, reason=reason, length=upstream.declared_length)
        # Its head is held back until the first write, and goes out in one write with the first chunk when
        # that arrived with it (an SSE stream's first event is one segment, not two); the head goes alone
        # when no byte of the body is here yet.
        response = request.stream(status, reason, headers, length)
        if not upstream.body_arrived:
            await response.write(b"")  # nothing of the body here yet: the head goes now, alone
        model.stats.count(status)
        try:
            while chunk := await upstream.next_chunk():
                await response.write(chunk)
        except UpstreamError as exc:
            # Too late for a 502: cut the client's connection so it sees a truncated response.
            model.log_failure(" mid-response", describe(exc))
            model.stats.upstream_error()
            request.transport.abort()
            return response
        # The body's end is written by the server once this returns, after the upstream connection, the
        # slot and the body's bytes are given back (`_proxy`): a client that sends its next request as soon
        # as the answer ends would otherwise wait for them.
        response.end_later()
        return response
