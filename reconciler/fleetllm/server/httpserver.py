"""The control plane's HTTP server: the project's HTTP/1.1 server on llhttp (fleetllm_gateway.httpserver,
the one the box gateway serves with) in front of the Flask app, in process.

Why not gunicorn's gthread worker: there a request thread reads the request line and headers itself,
so eight connections trickling one header every 2 s (or sending nothing) held all eight threads of the
one worker and every box's config fetch timed out. Here one event loop (epoll: no select() limit of
1,024 descriptors) reads every connection; a request reaches a thread of the pool (`server.threads`)
only once its headers and its whole body have arrived. Why not Tornado's server, which this was
until issue 28: its HTTP/1 handling alone cost 130-200 us of CPU a request, more than the box
contract's own work (docs/benchmarks.md, "Config serving"). What a connection may hold is bounded:

- headers: all of them within `server.header_timeout_s` of the connection opening (or of the first
  byte of a later request; an idle kept-alive connection is closed after the same time), at most
  `server.max_header_bytes`; a deadline over the whole header block, so a trickle gains nothing.
  Each connection's deadline falls at random in [70 %, 100 %] of it (JITTER): a crowd opened
  together then expires over a few seconds instead of in one loop turn;
- bodies: all of it within `server.body_timeout_s` (else the connection is closed); at most 64 KiB
  declared without further ado, a larger or chunked body only while the shared budget
  `server.body_buffer_bytes` has room, and never more than its endpoint takes (BODY_CAPS; the app
  answers 413 above its own, smaller limit); over either, 400 and the connection closed;
- answers: one at a time per connection (a pipelined request is parsed only once the one before is
  answered); a response a client does not read is dropped, and its connection closed, after
  `server.timeout_s`;
- connections: `server.max_connections_per_peer` per IPv4 address or IPv6 /64 (trusted proxies
  exempt), `server.max_connections` in all (and the descriptor limit is raised to fit them). A
  connection over a cap is closed at once, before a byte is read (with TLS, before its handshake,
  which must then end within `server.header_timeout_s`).

Malformed HTTP gets a 400 naming the kind of error (never the bytes sent) and the connection closed.
guard.py holds the caps' and the budget's bookkeeping.

GET /vllm/config is answered on the event loop itself when it can be from memory (boxloop.py: no
WSGI environment, no thread hop); everything else goes to the Flask app on the pool (`call_wsgi`).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import re
import resource
import signal
import ssl
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any, cast
from urllib.parse import unquote_to_bytes

from fleetllm.logs import get_logger, log_event
from fleetllm.server.accesslog import access_logged
from fleetllm.server.boxloop import BoxLoop
from fleetllm.server.guard import BodyBudget, ConnectionCaps, Refusal, body_share
from fleetllm.server.runtime import Runtime
from fleetllm.settings import ControlPlaneConfig, Listen
from fleetllm_contract.sdnotify import sd_notify
from fleetllm_gateway.httpserver import HttpConnection, HttpServer, Limits, Request, Response

log = get_logger("http")
SERVER = "fleetllm"  # the Server header (no version: nothing to fingerprint)
SMALL_BODY = 64 * 1024  # declared bodies up to this size need no share of the body budget
DEFAULT_BODY_CAP = 1024 * 1024  # the app refuses above 64 KiB with 413; the transport cuts at 1 MiB
BODY_CAPS = {"/hooks/push": 6 * 1024 * 1024}  # GitHub push events (the app takes 5 MiB)
RESERVED_FDS = 256  # descriptors kept for the state store, git, logs and the listening sockets
GRACE_S = 10.0  # on SIGTERM, how long requests in flight may take to finish
FIRST_REQUEST_GRACE_S = 1.0  # on SIGTERM, how long a connection just accepted has to send its request
SWEEP_S = 1.0
SWITCH_INTERVAL_S = 0.001
JITTER = 0.3  # header deadlines fall at random in [70 %, 100 %] of server.header_timeout_s
MAX_FIELDS = 1000  # header fields of one request
JSON = [("Content-Type", "application/json")]
INTERNAL_ERROR = Response(500, b'{"error":"internal error; see the control plane\'s log"}', JSON)
HOP_BY_HOP = frozenset({"content-length", "transfer-encoding", "connection", "keep-alive"})
WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def body_cap(path: str) -> int:
    return BODY_CAPS.get(path, DEFAULT_BODY_CAP)


def raise_fd_limit(wanted: int) -> int:
    """Raise the soft RLIMIT_NOFILE towards `wanted` (up to the hard limit); returns the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft if soft != resource.RLIM_INFINITY else wanted


def connection_limits(header_timeout_s: float, max_header_bytes: int, body_timeout_s: float) -> Limits:
    """The HTTP server's limits from the server.* settings."""
    return Limits(header_timeout=header_timeout_s, keepalive_timeout=header_timeout_s, drain_timeout=body_timeout_s,
                  max_line=max_header_bytes, max_head_bytes=max_header_bytes, max_fields=MAX_FIELDS,
                  max_pipelined=0, header_jitter=JITTER, server=SERVER)


class _BodyLateError(ConnectionError):
    """A request body that did not arrive within server.body_timeout_s: the connection is closed without
    an answer (as it is when a body breaks its framing: fleetllm_gateway.errors.IncompleteBodyError)."""


def _refusal(text: str) -> Response:
    return Response(400, f"Bad Request: {text}\n".encode(), [("Content-Type", "text/plain; charset=utf-8")])


BAD_HOST = _refusal("one Host header is required, a host name or address with an optional numeric port")
BODY_TOO_LARGE = _refusal("the request body is larger than this endpoint takes")
BODY_BUDGET_FULL = _refusal("the server is buffering too many request bodies; retry later")


# RFC 3986's uri-host (an IP literal in brackets, or a registered name or IPv4 address; no "," although
# the RFC allows one, so two Host fields joined are told apart from one) and an optional port.
_HOST = re.compile(r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._~!$&'()*+;=%-]*)(?::[0-9]*)?")


def host_is_valid(request: Request) -> bool:
    """RFC 9112, 3.2: an HTTP/1.1 request has exactly one Host field, its value a host and an optional
    port; a server answers any other 400. (HTTP/1.0 may leave it out.)"""
    host = request.joined("host")
    if host is None:
        return request.version == "1.0"
    return _HOST.fullmatch(host) is not None


def wsgi_environ(request: Request, body: bytes, scheme: str, local: tuple[str, int]) -> dict[str, Any]:
    """The WSGI environment of `request` (PEP 3333: text as latin-1), its body read whole (and de-chunked:
    Werkzeug reads no chunked body without a length). A header whose name holds `_` is left out:
    `X_Forwarded_For` would otherwise stand in for X-Forwarded-For."""
    path, _, query = request.target.partition("?")
    host = request.header("host") or ""
    name, colon, port = host.rpartition(":")
    if not (colon and port.isdigit() and not name.endswith(":")):
        name, port = host or local[0], str(local[1])
    environ: dict[str, Any] = {
        "REQUEST_METHOD": request.method,
        "SCRIPT_NAME": "",
        "PATH_INFO": unquote_to_bytes(path).decode("latin-1"),
        "QUERY_STRING": query,
        "REMOTE_ADDR": request.remote,
        "SERVER_NAME": name,
        "SERVER_PORT": port,
        "SERVER_PROTOCOL": f"HTTP/{request.version}",
        "CONTENT_LENGTH": str(len(body)),
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": scheme,
        "wsgi.input": io.BytesIO(body),
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": True,
        "wsgi.multiprocess": False,
        "wsgi.run_once": False,
    }
    for field, value in request.headers:
        if "_" in field:
            continue
        text = value if value.isascii() else value.encode("utf-8", "surrogateescape").decode("latin-1")
        key = field.upper().replace("-", "_")
        if key in ("CONTENT_LENGTH", "TRANSFER_ENCODING"):  # the body is read whole, de-chunked: its length is set
            continue
        if key != "CONTENT_TYPE":
            key = "HTTP_" + key
        environ[key] = f"{environ[key]},{text}" if key in environ else text
    return environ


def call_wsgi(app: WsgiApp, environ: dict[str, Any]) -> tuple[int, str, list[tuple[str, str]], bytes]:
    """Run `app` on `environ` to the end of its body (on a thread of the pool): status, reason, headers
    as the app gave them, and body."""
    started: list[Any] = []
    parts: list[bytes] = []

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable[[bytes], Any]:
        if exc_info is not None and started:
            raise exc_info[1].with_traceback(exc_info[2])
        started[:] = [status, headers]
        return parts.append

    result = app(environ, start_response)
    try:
        parts.extend(result)
    finally:
        close = getattr(result, "close", None)
        if close is not None:
            close()
    status, headers = started
    code, _, reason = status.partition(" ")
    return int(code), reason, headers, b"".join(parts)


class PlaneConnection(HttpConnection):
    """A client connection, admitted under the connection caps (or closed at once), then (with TLS) its
    handshake, which must end within the header deadline."""

    __slots__ = ("_admitted", "_handshake")

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        server = cast(PlaneServer, self._server)
        peer = transport.get_extra_info("peername")
        address = peer[0] if isinstance(peer, tuple) and peer else ""
        why = server.caps.admit(address)
        self._admitted = why is None
        self._handshake: asyncio.Task[None] | None = None
        if why is not None:
            server.refused(why)
            transport.close()
            return
        self.remote = address
        server.opened()
        if server.tls is None:
            super().connection_made(transport)
        else:
            self._handshake = server.loop.create_task(self._start_tls(cast(asyncio.Transport, transport), server.tls))

    async def _start_tls(self, transport: asyncio.Transport, context: ssl.SSLContext) -> None:
        try:
            tls = await self._server.loop.start_tls(transport, self, context, server_side=True,
                                                    ssl_handshake_timeout=self.limits.header_timeout)
        except (OSError, ssl.SSLError, TimeoutError, ConnectionError, RuntimeError):
            transport.abort()  # a failed or late handshake: nothing to answer
            self._release()
            return
        finally:
            self._handshake = None
        if tls is None:  # the client left as the handshake ended
            self._release()
            return
        super().connection_made(tls)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._handshake is not None:
            self._handshake.cancel()
        super().connection_lost(exc)
        self._release()

    def _release(self) -> None:
        if self._admitted:
            self._admitted = False
            cast(PlaneServer, self._server).closed(self.remote)


class PlaneServer(HttpServer):
    """The protocol factory: the HTTP server with connection caps, the body budget, a send deadline,
    and the control plane's handler (the box path on the loop, the rest through WSGI on `executor`)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, app: WsgiApp, executor: Executor, box: BoxLoop | None, *,
                 limits: Limits, caps: ConnectionCaps, budget: BodyBudget, body_timeout_s: float,
                 send_timeout_s: float, tls: ssl.SSLContext | None = None,
                 on_change: Callable[[int], None] | None = None,
                 on_refusal: Callable[[Refusal], None] | None = None) -> None:
        super().__init__(self.handle, loop, limits, INTERNAL_ERROR, log)
        self.app = app
        self.executor = executor
        self.box = box
        self.caps = caps
        self.budget = budget
        self.body_timeout_s = body_timeout_s
        self.send_timeout_s = send_timeout_s
        self.tls = tls
        self.scheme = "https" if tls is not None else "http"
        self.local: tuple[str, int] = ("localhost", 0)
        self._on_change = on_change
        self._on_refusal = on_refusal
        self._writing_since: dict[HttpConnection, float] = {}
        self._refused: dict[Refusal, int] = {}
        self._refusals_logged_at = 0.0

    def __call__(self) -> HttpConnection:
        return PlaneConnection(self)

    # --- connections -----------------------------------------------------------------------------
    def opened(self) -> None:
        if self._on_change is not None:
            self._on_change(self.caps.total)

    def closed(self, peer: str) -> None:
        self.caps.release(peer)
        if self._on_change is not None:
            self._on_change(self.caps.total)

    def refused(self, why: Refusal) -> None:
        self._refused[why] = self._refused.get(why, 0) + 1
        if self._on_refusal is not None:
            self._on_refusal(why)

    def sweep(self, now: float) -> None:
        """Close connections whose answer has been waiting on a client that does not read it for more
        than send_timeout_s; log the refusals since the last line (at most one line every 10 s)."""
        writing = self._writing_since
        for conn in list(writing):
            if conn not in self.connections:
                del writing[conn]
        for conn in list(self.connections):
            transport = conn.transport
            if transport is None or transport.is_closing() or not transport.get_write_buffer_size():
                writing.pop(conn, None)
            elif now - writing.setdefault(conn, now) > self.send_timeout_s:
                writing.pop(conn, None)
                conn.abort()
        self.log_refusals(now)

    def log_refusals(self, now: float, *, force: bool = False) -> None:
        """One line for the refusals since the last one, at most every 10 s (or now, when stopping)."""
        if self._refused and (force or now - self._refusals_logged_at >= 10):
            log_event(log, "connections refused", logging.WARNING, **{str(k): v for k, v in self._refused.items()},
                      open=self.caps.total, peers=self.caps.peers)
            self._refused.clear()
            self._refusals_logged_at = now

    # --- requests --------------------------------------------------------------------------------
    async def handle(self, request: Request) -> Response:
        if not host_is_valid(request):
            request.keep_alive = False
            return BAD_HOST
        if self.box is not None:
            answer = self.box.answer(request)
            if answer is not None:
                return answer
        path = request.target.partition("?")[0]
        cap = body_cap(path)
        chunked = request.header("transfer-encoding") is not None
        share = body_share(request.header("content-length"), chunked, cap, SMALL_BODY)
        if share and not self.budget.take(share, request.remote):
            self.refused(Refusal.BODY_BUDGET)
            request.keep_alive = False
            return BODY_BUDGET_FULL
        try:
            limit = cap if share or chunked else min(cap, SMALL_BODY)
            if (request.content_length or 0) > limit:
                request.keep_alive = False
                return BODY_TOO_LARGE
            body = await self._read_body(request, limit)
            if body is None:
                request.keep_alive = False
                return BODY_TOO_LARGE
            environ = wsgi_environ(request, body, self.scheme, self.local)
            status, reason, headers, out = await self.loop.run_in_executor(self.executor, call_wsgi, self.app, environ)
        finally:
            if share:
                self.budget.give_back(share, request.remote)
        kept = [(name, value) for name, value in headers if name.lower() not in HOP_BY_HOP]
        length = None
        if request.method == "HEAD" or status == 304:
            declared = next((value for name, value in headers if name.lower() == "content-length"), None)
            length = int(declared) if declared is not None and declared.isdigit() else None
        return Response(status, out, kept, reason=reason or None, length=length)

    async def _read_body(self, request: Request, limit: int) -> bytes | None:
        """The whole body, or None when it is over `limit`; _BodyLateError when it does not arrive within
        body_timeout_s (a body that breaks its framing raises the server's IncompleteBodyError)."""
        if not request.has_body:
            return b""
        request.send_continue()
        parts: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(self.body_timeout_s):
                while chunk := await request.body.readany():
                    size += len(chunk)
                    if size > limit:
                        return None
                    parts.append(chunk)
        except TimeoutError:
            raise _BodyLateError("the request body did not arrive in time") from None
        return b"".join(parts)


def _notify(state: str) -> None:
    """Tell systemd (fleetllm_contract.sdnotify); an unreachable $NOTIFY_SOCKET is logged, never fatal."""
    try:
        sd_notify(state)
    except OSError as exc:
        log_event(log, "sd_notify failed", logging.WARNING, state=state, error=exc.strerror or str(exc))


def tls_context(config: ControlPlaneConfig) -> ssl.SSLContext | None:
    if config.tls is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(config.tls.cert, config.tls.key)
    return context


def plane_server(config: ControlPlaneConfig, app: WsgiApp, executor: Executor, box: BoxLoop | None,
                 max_total: int, metrics: Any = None) -> PlaneServer:
    """The server for `config`'s limits, on the running loop."""
    limits = config.limits
    return PlaneServer(
        asyncio.get_running_loop(), app, executor, box,
        limits=connection_limits(limits.header_timeout_s, limits.max_header_bytes, limits.body_timeout_s),
        caps=ConnectionCaps(max_total, limits.max_connections_per_peer, limits.max_connections_per_network,
                            config.trusted_proxies, limits.network_cap_exempt),
        budget=BodyBudget(limits.body_buffer_bytes, SMALL_BODY, config.trusted_proxies),
        body_timeout_s=limits.body_timeout_s, send_timeout_s=float(config.timeout_s), tls=tls_context(config),
        on_change=metrics.connections_open.set if metrics is not None else None,
        on_refusal=(lambda why: metrics.connections_refused.labels(str(why)).inc()) if metrics is not None else None)


async def listen_on(server: PlaneServer, listen: Listen) -> asyncio.AbstractServer:
    """Accept connections for `server` at `listen` (port 0: a free one, in `server.local`). TLS is the
    connection's own (PlaneConnection), once it is admitted: a crowd of handshakes is capped as well."""
    listening = await server.loop.create_server(server, listen.host, listen.port, backlog=1024)
    sockets: Sequence[Any] = listening.sockets
    server.local = (listen.host, sockets[0].getsockname()[1])
    return listening


def run(config: ControlPlaneConfig, listen: Listen, load_app: Callable[[], Any],
        on_exit: Callable[[], None] | None = None, metrics: Any = None) -> None:
    """Serve until SIGTERM or SIGINT; then stop accepting, let requests in flight finish (GRACE_S),
    close every connection and call `on_exit` (which writes out the buffered fetch records)."""
    limits = config.limits
    soft = raise_fd_limit(limits.max_connections + RESERVED_FDS)
    max_total = min(limits.max_connections, max(16, soft - RESERVED_FDS))
    if max_total < limits.max_connections:
        log_event(log, "descriptor limit lower than server.max_connections", logging.WARNING,
                  max_connections=limits.max_connections, effective=max_total, nofile=soft)
    # The event loop shares the GIL with the request threads: with CPython's default 5 ms switch
    # interval a loop turn can wait that long for each busy thread, which is most of the config
    # fetch's tail on a busy machine (docs/benchmarks.md, "Slow and idle clients").
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    asyncio.run(_serve(config, listen, load_app, max_total, on_exit, metrics))


async def _serve(config: ControlPlaneConfig, listen: Listen, load_app: Callable[[], Any], max_total: int,
                 on_exit: Callable[[], None] | None, metrics: Any) -> None:
    limits = config.limits
    app = load_app()
    runtime = getattr(app, "extensions", {}).get("fleetllm")
    metrics = metrics if metrics is not None else getattr(runtime, "metrics", None)
    executor = ThreadPoolExecutor(config.threads, thread_name_prefix="fleetllm-request")
    box = BoxLoop(runtime, executor) if isinstance(runtime, Runtime) else None
    server = plane_server(config, access_logged(app), executor, box, max_total, metrics)
    listening = await listen_on(server, listen)
    loop = asyncio.get_running_loop()

    async def sweeping() -> None:
        while True:
            await asyncio.sleep(SWEEP_S)
            server.sweep(time.monotonic())

    sweeper = loop.create_task(sweeping())
    log_event(log, "serving", listen=listen.bind, tls=config.tls is not None, threads=config.threads,
              header_timeout_s=limits.header_timeout_s, body_timeout_s=limits.body_timeout_s,
              max_connections=max_total, max_connections_per_peer=limits.max_connections_per_peer,
              max_connections_per_network=limits.max_connections_per_network,
              network_cap_exempt=[str(n) for n in limits.network_cap_exempt])
    stopping = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    _notify("READY=1")  # the port accepts connections and SIGTERM drains (systemd Type=notify)
    try:
        await stopping.wait()
        log_event(log, "stopping", in_flight=server.answering())
        _notify("STOPPING=1")
        await server.shutdown([listening], GRACE_S, FIRST_REQUEST_GRACE_S)
        sweeper.cancel()
        server.log_refusals(time.monotonic(), force=True)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(listening.wait_closed(), timeout=5)
    finally:
        executor.shutdown(wait=False, cancel_futures=True)
        if box is not None:
            box.record()  # the last loop turn's answers, before on_exit writes out the fetch log
        if on_exit is not None:
            on_exit()
