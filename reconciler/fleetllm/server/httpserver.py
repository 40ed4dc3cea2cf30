"""The control plane's HTTP server: Tornado's HTTP/1.1 server in front of the Flask app, in process.

Why Tornado, not gunicorn's gthread worker: there a request thread reads the request line and
headers itself, so eight connections trickling one header every 2 s (or sending nothing) held all
eight threads of the one worker and every box's config fetch timed out. Here one event loop (epoll:
no select() limit of 1,024 descriptors) reads every connection; a request reaches a thread of the
pool (`server.threads`) only once its headers and its whole body have arrived. What a connection may
hold is bounded:

- headers: all of them within `server.header_timeout_s` of the connection opening (or of the
  previous answer on a kept-alive connection: idle connections are closed by the same deadline), at
  most `server.max_header_bytes`; Tornado's own deadline, over the whole header block, so a
  trickle that resets an idle timer gains nothing;
- bodies: all of it within `server.body_timeout_s`; at most 64 KiB declared without further ado, a
  larger or chunked body only while the shared budget `server.body_buffer_bytes` has room, and never
  more than its endpoint takes (BODY_CAPS; the app answers 413 above its own, smaller limit);
- answers: a response a client does not read is dropped, and its connection closed, after
  `server.timeout_s`;
- connections: `server.max_connections_per_peer` per IPv4 address or IPv6 /64 (trusted proxies
  exempt), `server.max_connections` in all (and the descriptor limit is raised to fit them). A
  connection over a cap is closed at once, before a byte is read.

Tornado has the deadlines and the caps on sizes; the per-peer and total connection caps, the body
budget and the send deadline are ours (reconciler/fleetllm/server/guard.py holds their bookkeeping).

A request that has passed those limits goes to the router (_Router): GET /vllm/config is answered on
the event loop itself when it can be from memory (boxloop.py: no WSGI environment, no thread hop),
everything else through the WSGI bridge to the Flask app on the pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import random
import resource
import signal
import ssl
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, cast

from tornado import httputil
from tornado.http1connection import HTTP1Connection, HTTP1ServerConnection
from tornado.httpserver import HTTPServer
from tornado.ioloop import PeriodicCallback
from tornado.iostream import IOStream
from tornado.wsgi import WSGIContainer

from fleetllm.logs import get_logger, log_event
from fleetllm.server.accesslog import access_logged
from fleetllm.server.boxloop import BoxLoop
from fleetllm.server.guard import BodyBudget, ConnectionCaps, Refusal, body_share
from fleetllm.server.runtime import Runtime
from fleetllm.settings import ControlPlaneConfig, Listen
from fleetllm_contract.sdnotify import sd_notify

log = get_logger("http")
SMALL_BODY = 64 * 1024  # declared bodies up to this size need no share of the body budget
DEFAULT_BODY_CAP = 1024 * 1024  # the app refuses above 64 KiB with 413; the transport cuts at 1 MiB
BODY_CAPS = {"/hooks/push": 6 * 1024 * 1024}  # GitHub push events (the app takes 5 MiB)
RESERVED_FDS = 256  # descriptors kept for the state store, git, logs and the listening sockets
GRACE_S = 10.0  # on SIGTERM, how long requests in flight may take to finish
SWEEP_S = 1.0
SWITCH_INTERVAL_S = 0.001
JITTER = 0.3  # header deadlines fall at random in [70 %, 100 %] of server.header_timeout_s


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


def quiet_tornado_logs() -> None:
    """Tornado's own log lines go to the JSON log without their arguments (a malformed-request line
    would otherwise quote what the client sent, Authorization included); its access log is off (ours,
    fleetllm.server.accesslog and the box blueprint's, log every answer without a secret)."""
    logging.getLogger("tornado.access").disabled = True
    forward = logging.getLogger("fleetllm.http")

    class Forward(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            record.msg = f"http server: {record.msg}" if isinstance(record.msg, str) else "http server event"
            record.args = ()
            record.exc_text = None
            record.stack_info = None
            forward.handle(record)

    for name in ("tornado.application", "tornado.general"):
        logger = logging.getLogger(name)
        logger.handlers = [Forward()]
        logger.propagate = False
        logger.setLevel(logging.WARNING)


class _BudgetedBody(httputil.HTTPMessageDelegate):
    """Sets the request's body cap from its path, and takes a share of the body budget for a large or
    chunked body before Tornado buffers it (given back when the body is in, or the connection gone)."""

    def __init__(self, inner: httputil.HTTPMessageDelegate, connection: httputil.HTTPConnection,
                 server: ControlPlaneHTTPServer) -> None:
        self.inner = inner
        self.connection = connection
        self.server = server
        self.share = 0
        self.peer = ""

    def headers_received(self, start_line: httputil.RequestStartLine | httputil.ResponseStartLine,
                         headers: httputil.HTTPHeaders) -> Any:
        path = cast(httputil.RequestStartLine, start_line).path.split("?", 1)[0]
        cap = body_cap(path)
        chunked = headers.get("Transfer-Encoding", "").lower() == "chunked"
        share = body_share(headers.get("Content-Length"), chunked, cap, SMALL_BODY)
        connection = cast(HTTP1Connection, self.connection)
        self.peer = self.server.peer_of(connection)
        if share and not self.server.budget.take(share, self.peer):
            self.server.refused(Refusal.BODY_BUDGET)
            cap = 0  # Tornado answers 400 and closes: the length is over the cap
        else:
            self.share = share
        connection.set_max_body_size(cap if share or chunked else min(cap, SMALL_BODY))
        return self.inner.headers_received(start_line, headers)

    def data_received(self, chunk: bytes) -> Any:
        return self.inner.data_received(chunk)

    def _give_back(self) -> None:
        if self.share:
            self.server.budget.give_back(self.share, self.peer)
            self.share = 0

    def finish(self) -> None:
        # The body stays in memory until the app has answered: the share goes with the request and
        # is given back when its answer is written (_Container.handle_request).
        request = getattr(self.inner, "request", None)
        if request is not None and self.share:
            request.fleetllm_share = (self.server.budget, self.share, self.peer)
            self.share = 0
        self._give_back()
        self.inner.finish()

    def on_connection_close(self) -> None:
        self._give_back()
        self.inner.on_connection_close()


class ControlPlaneHTTPServer(HTTPServer):
    """Tornado's HTTPServer with connection caps, the body budget and a send deadline."""

    def guard(self, caps: ConnectionCaps, budget: BodyBudget, send_timeout_s: float,
              on_change: Callable[[int], None] | None = None,
              on_refusal: Callable[[Refusal], None] | None = None) -> None:
        self.caps = caps
        self.budget = budget
        self.send_timeout_s = send_timeout_s
        self._on_change = on_change
        self._on_refusal = on_refusal
        self._peers: dict[IOStream, str] = {}
        self._writing_since: dict[IOStream, float] = {}
        self._refused: dict[Refusal, int] = {}
        self._refusals_logged_at = 0.0

    def peer_of(self, connection: HTTP1Connection) -> str:
        """The peer address a connection was admitted for ("" when unknown)."""
        stream = getattr(connection, "stream", None)
        return self._peers.get(stream, "") if stream is not None else ""

    def refused(self, why: Refusal) -> None:
        self._refused[why] = self._refused.get(why, 0) + 1
        if self._on_refusal is not None:
            self._on_refusal(why)

    def handle_stream(self, stream: IOStream, address: Any) -> None:
        peer = address[0] if isinstance(address, tuple) and address else ""
        why = self.caps.admit(peer)
        if why is not None:
            self.refused(why)
            stream.close()
            return
        self._peers[stream] = peer
        if self._on_change is not None:
            self._on_change(self.caps.total)
        # Each connection gets its header deadline somewhat early, at random (JITTER): a crowd of
        # connections opened together then expires over a few seconds instead of in one loop turn.
        shared = self.conn_params
        self.conn_params = copy.copy(shared)
        self.conn_params.header_timeout = (shared.header_timeout or 3600) * (1 - JITTER * random.random())  # noqa: S311
        try:
            super().handle_stream(stream, address)
        except Exception as exc:  # never a connection left open and counted with nobody reading it
            log_event(log, "connection setup failed", logging.ERROR, error=type(exc).__name__)
            self._peers.pop(stream, None)
            self.caps.release(peer)
            stream.close()
        finally:
            self.conn_params = shared

    def on_close(self, server_conn: object) -> None:
        stream = cast(HTTP1ServerConnection, server_conn).stream
        peer = self._peers.pop(stream, None)
        self._writing_since.pop(stream, None)
        if peer is not None:
            self.caps.release(peer)
            if self._on_change is not None:
                self._on_change(self.caps.total)
        super().on_close(server_conn)

    def start_request(self, server_conn: object, request_conn: httputil.HTTPConnection
                      ) -> httputil.HTTPMessageDelegate:
        return _BudgetedBody(super().start_request(server_conn, request_conn), request_conn, self)

    def sweep(self, now: float) -> None:
        """Close connections whose answer has been waiting on a client that does not read it for more
        than send_timeout_s; log the refusals since the last line (at most one line every 10 s)."""
        for stream in list(self._peers):
            if stream.closed() or not stream.writing():
                self._writing_since.pop(stream, None)
            elif now - self._writing_since.setdefault(stream, now) > self.send_timeout_s:
                self._writing_since.pop(stream, None)
                stream.close()
        self.log_refusals(now)

    def log_refusals(self, now: float, *, force: bool = False) -> None:
        """One line for the refusals since the last one, at most every 10 s (or now, when stopping)."""
        if self._refused and (force or now - self._refusals_logged_at >= 10):
            log_event(log, "connections refused", logging.WARNING, **{str(k): v for k, v in self._refused.items()},
                      open=self.caps.total, peers=self.caps.peers)
            self._refused.clear()
            self._refusals_logged_at = now


class _Container(WSGIContainer):
    """WSGIContainer on a thread pool, answering instead of hanging when it cannot build the WSGI
    environment (Tornado's own raises on a Host header such as `a:b`, and the client would wait on)."""

    def environ(self, request: httputil.HTTPServerRequest) -> dict[str, Any]:
        """Tornado's environment, with the body's real length: Tornado has read (and de-chunked) the
        whole body, and without a Content-Length Werkzeug reads none of a chunked one."""
        environ: dict[str, Any] = super().environ(request)
        environ.pop("HTTP_TRANSFER_ENCODING", None)
        environ["CONTENT_LENGTH"] = str(len(request.body or b""))
        return environ

    async def handle_request(self, request: httputil.HTTPServerRequest) -> None:
        try:
            await super().handle_request(request)
        except Exception as exc:
            self._failed(request, exc)
        finally:
            give_back_share(request)

    def _failed(self, request: httputil.HTTPServerRequest, exc: Exception) -> None:
        log_event(log, "request failed in the http layer", logging.WARNING, error=type(exc).__name__,
                  peer=request.remote_ip)
        status, reason = (400, "Bad Request") if isinstance(exc, ValueError) else (500, "Internal Server Error")
        body = b'{"error":"bad request: check the Host header"}' if status == 400 else \
            b'{"error":"internal error; see the control plane\'s log"}'
        connection = request.connection
        if connection is None:
            return
        try:
            connection.write_headers(httputil.ResponseStartLine("HTTP/1.1", status, reason), httputil.HTTPHeaders(
                {"Content-Type": "application/json", "Content-Length": str(len(body)), "Connection": "close"}),
                chunk=body)
            connection.finish()
        except Exception:  # the answer had started: nothing more to say on this connection
            cast(HTTP1Connection, connection).close()


def give_back_share(request: httputil.HTTPServerRequest) -> None:
    """Return the body budget's share a request held (_BudgetedBody.finish) once it is answered."""
    held = getattr(request, "fleetllm_share", None)
    if held is not None:
        held[0].give_back(held[1], held[2])
        request.fleetllm_share = None  # type: ignore[attr-defined]


class _Router:
    """The request callback: GET /vllm/config on the event loop (boxloop.BoxLoop) when it can be
    answered from memory, everything else through the WSGI container to the Flask app on a thread."""

    def __init__(self, container: _Container, box: BoxLoop | None) -> None:
        self.container = container
        self.box = box

    def __call__(self, request: httputil.HTTPServerRequest) -> None:
        if self.box is not None:
            try:
                handled = self.box.answer(request)
            except Exception as exc:  # a bug: answered 500 as the app's would be, the connection kept sane
                self.container._failed(request, exc)
                handled = True
            if handled:
                give_back_share(request)
                return
        self.container(request)


@dataclass
class InFlight:
    """Requests in the app right now (SIGTERM waits for them)."""

    count: int = 0

    def __post_init__(self) -> None:
        self._lock = threading.Lock()

    def wrap(self, app: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
            with self._lock:
                self.count += 1
            try:
                return app(environ, start_response)
            finally:
                with self._lock:
                    self.count -= 1
        return wrapped


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
    quiet_tornado_logs()
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
    inflight = InFlight()
    container = _Container(inflight.wrap(access_logged(app)), executor=executor)
    box = BoxLoop(runtime, executor) if isinstance(runtime, Runtime) else None
    server = ControlPlaneHTTPServer(
        _Router(container, box), ssl_options=tls_context(config),
        max_header_size=limits.max_header_bytes, idle_connection_timeout=limits.header_timeout_s,
        body_timeout=limits.body_timeout_s, max_body_size=SMALL_BODY, decompress_request=False, xheaders=False)
    server.guard(ConnectionCaps(max_total, limits.max_connections_per_peer, limits.max_connections_per_network,
                                config.trusted_proxies, limits.network_cap_exempt),
                 BodyBudget(limits.body_buffer_bytes, SMALL_BODY, config.trusted_proxies), float(config.timeout_s),
                 on_change=metrics.connections_open.set if metrics is not None else None,
                 on_refusal=(lambda why: metrics.connections_refused.labels(str(why)).inc())
                 if metrics is not None else None)
    server.listen(listen.port, address=listen.host, backlog=1024)
    sweeper = PeriodicCallback(lambda: server.sweep(time.monotonic()), SWEEP_S * 1000)
    sweeper.start()
    log_event(log, "serving", listen=listen.bind, tls=config.tls is not None, threads=config.threads,
              header_timeout_s=limits.header_timeout_s, body_timeout_s=limits.body_timeout_s,
              max_connections=max_total, max_connections_per_peer=limits.max_connections_per_peer,
              max_connections_per_network=limits.max_connections_per_network,
              network_cap_exempt=[str(n) for n in limits.network_cap_exempt])
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    _notify("READY=1")  # the port accepts connections and SIGTERM drains (systemd Type=notify)
    try:
        await stopping.wait()
        log_event(log, "stopping", in_flight=inflight.count)
        _notify("STOPPING=1")
        server.stop()
        deadline = time.monotonic() + GRACE_S
        while inflight.count and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        sweeper.stop()
        server.log_refusals(time.monotonic(), force=True)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(server.close_all_connections(), timeout=5)
    finally:
        executor.shutdown(wait=False, cancel_futures=True)
        if box is not None:
            box.record()  # the last loop turn's answers, before on_exit writes out the fetch log
        if on_exit is not None:
            on_exit()
