"""Run the gateway (one process, or one worker of several: fleetllm_gateway.workers): report READY=1 once
the socket is bound, reload on SIGHUP, serve until SIGTERM or SIGINT."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest
from aiohttp.web_response import Response, StreamResponse

from fleetllm_contract.sdnotify import sd_notify
from fleetllm_gateway.app import Gateway
from fleetllm_gateway.config import ConfigError, GatewayConfig
from fleetllm_gateway.errors import GatewayError
from fleetllm_gateway.shared import Shared

# Imported here too, not only where the loop starts: with several workers this module is imported by the
# master before it forks them, so uvloop's modules are shared by all of them instead of imported by each.
with contextlib.suppress(ImportError):  # uvloop is optional
    import uvloop  # noqa: F401

log = logging.getLogger("gateway")

SHUTDOWN_GRACE = 5.0  # seconds in-flight requests get after SIGTERM (Supervisor's stopwaitsecs is 10)
FIRST_REQUEST_GRACE = 1.0  # seconds a connection accepted before a stop gets to send its first request
HEADER_TIMEOUT = 10.0  # seconds a request gets to send its header block, as LLMhop's (Go's ReadHeaderTimeout)


class _HeaderDeadline(RequestHandler):
    """aiohttp's connection protocol with LLMhop's header-read timeout, which aiohttp lacks: the clock
    starts when the connection opens, and for each later request at its first byte, and stops when the
    header block is parsed; past the deadline the connection is closed without an answer, as Go does.
    Without it a client trickling header bytes holds a connection (and a file descriptor) for ever.
    Idle keep-alive connections are not timed by this (aiohttp's keep-alive timeout applies), nor are
    bodies and responses."""

    header_timeout = HEADER_TIMEOUT

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._last_payload: Any = None  # the newest request's body stream

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._start_deadline()

    def data_received(self, data: bytes) -> None:
        parsed_before = self._request_count
        if data and self._deadline is None and self._between_requests():
            self._start_deadline()
        super().data_received(data)
        if self._request_count > parsed_before:  # a header block is complete
            self._cancel_deadline()
            if self._messages:
                self._last_payload = self._messages[-1][1]

    def _between_requests(self) -> bool:
        """True when the next bytes can only start a new request (not a body still being sent)."""
        body_pending = self._last_payload is not None and not self._last_payload.is_eof()
        return not (self._messages or self._request_in_progress or body_pending or self._upgraded)

    def _start_deadline(self) -> None:
        self._deadline = self._loop.call_later(self.header_timeout, self._headers_too_slow)

    def _headers_too_slow(self) -> None:
        self._deadline = None
        self.force_close()  # closes the transport (and forgets it): nothing else to do

    def handle_error(self, request: BaseRequest, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> StreamResponse:
        """Malformed requests (aiohttp's parser raised HttpProcessingError) are the client's fault:
        one log line naming the peer and the kind of error, and a 400 whose body names the kind too.
        aiohttp's own handler logs a traceback whose message quotes the raw request, Authorization
        header included, and sends that quote back in the body; neither may happen here."""
        if not isinstance(exc, HttpProcessingError):
            return super().handle_error(request, status, exc, message)
        what = client_error(exc)
        log.info("refused a malformed request", extra={"fields": {"peer": request.remote or "?", "error": what}})
        response = Response(status=exc.code if 400 <= exc.code < 500 else 400, text=f"Bad Request: {what}\n",
                            content_type="text/plain")
        response.force_close()
        return response

    def _cancel_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def connection_lost(self, exc: BaseException | None) -> None:
        self._cancel_deadline()
        super().connection_lost(exc)


_CLIENT_ERRORS = {  # aiohttp's exception class -> what the client is told (never the bytes it sent)
    "LineTooLong": "a request line or header line is too long (limit 8190 bytes)",
    "BadStatusLine": "malformed request line (HTTP/1.x with CRLF line endings expected)",
    "BadHttpMethod": "malformed request method",
    "InvalidHeader": "malformed header",
    "InvalidURLError": "malformed request target",
    "TransferEncodingError": "malformed chunked body",
    "ContentLengthError": "the body is shorter than its Content-Length",
    "ContentEncodingError": "malformed content encoding",
    "BadHttpMessage": "malformed header block or chunked framing",
}


def client_error(exc: HttpProcessingError) -> str:
    """A fixed description of a parse error: aiohttp's messages quote the offending bytes."""
    for cls in type(exc).__mro__:
        if cls.__name__ in _CLIENT_ERRORS:
            return _CLIENT_ERRORS[cls.__name__]
    return "malformed HTTP request"


class _Server(web.Server):
    def __call__(self) -> RequestHandler:
        return _HeaderDeadline(self, loop=self._loop, **self._kwargs)


class BindError(GatewayError):
    pass


def serve_forever(coro: Coroutine[Any, Any, int]) -> int:
    """Run on uvloop when it is installed (about a third faster here), else on asyncio's loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    if hasattr(uvloop, "run"):  # uvloop >= 0.18
        return int(uvloop.run(coro))
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return asyncio.run(coro)


async def serve(config: GatewayConfig, *, reload: Callable[[], GatewayConfig] | None = None,
                listeners: Sequence[socket.socket] = (), shared: Shared | None = None,
                ready: Callable[[], None] | None = None) -> int:
    """Serve until SIGTERM or SIGINT. Alone (no `listeners`): bind, log "listening", notify READY=1, and
    on SIGHUP reload with `reload()` (a new config, or ConfigError). As a worker: serve on the master's
    `listeners`, call `ready()` once they accept; the master logs, notifies and reloads."""
    current = Gateway(config, environ=os.environ, shared=shared)

    def handle(request: BaseRequest) -> Awaitable[StreamResponse]:  # no coroutine of its own: one frame less
        return current.handle(request)

    server = _Server(handle, handler_cancellation=True, access_log=None, auto_decompress=False)
    try:
        runner = web.ServerRunner(server, shutdown_timeout=SHUTDOWN_GRACE)
    except TypeError:  # aiohttp < 3.9 takes it on the site
        runner = web.ServerRunner(server)
    await runner.setup()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        if listeners:
            for sock in listeners:
                await web.SockSite(runner, sock, backlog=1024).start()
            signal.signal(signal.SIGHUP, signal.SIG_IGN)  # the master's to handle
            if ready is not None:
                ready()
            await stop.wait()
            await _stop_accepting(runner, server)
            return 0
        site = web.TCPSite(runner, config.host or None, config.port, backlog=1024, reuse_address=True)
        try:
            await site.start()
        except OSError as exc:
            raise BindError(f"listen tcp {config.listen_address}: {exc.strerror or exc}") from None
        log_listening(config, 1)
        notify("READY=1")

        def reload_now() -> None:
            nonlocal current
            if reload is None:
                return
            notify("RELOADING=1", quiet=True)
            try:
                new = reloaded(config, reload)
                if new is not None:
                    previous, current = current, Gateway(new, environ=os.environ, previous=current)
                    previous.close()
                    log_listening(new, 1, event="reloaded")
            finally:
                notify("READY=1", quiet=True)

        loop.add_signal_handler(signal.SIGHUP, reload_now)
        await stop.wait()
        log.info("stopping")
        with contextlib.suppress(OSError):
            sd_notify("STOPPING=1")
        await _stop_accepting(runner, server)
    finally:
        await runner.cleanup()
        current.close()
    return 0


async def _stop_accepting(runner: web.BaseRunner, server: web.Server) -> None:
    """Close the listening sockets, then give connections accepted but still without their first request
    up to FIRST_REQUEST_GRACE to send it: aiohttp's clean-up closes idle connections at once, and one
    accepted an instant before (a client that connected and is sending) would lose its request. A
    worker retiring in a reload relies on it: its slot's socket stays open in the new worker."""
    for site in list(runner.sites):
        await site.stop()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + FIRST_REQUEST_GRACE
    while loop.time() < deadline and any(getattr(conn, "_request_count", 1) == 0 for conn in server.connections):
        await asyncio.sleep(0.01)


def reloaded(running: GatewayConfig, reload: Callable[[], GatewayConfig]) -> GatewayConfig | None:
    """The new configuration of a reload, or None (logged) when it cannot replace the running one."""
    from fleetllm_gateway.proxyenv import ProxyError

    try:
        new = reload()
        Gateway(new, environ=os.environ).close()  # a proxy it cannot use raises ProxyError
    except ConfigError as exc:
        for problem in exc.problems:
            log.error("reload refused: invalid configuration, still serving the previous one",
                      extra={"fields": {"problem": problem}})
        return None
    except ProxyError as exc:
        log.error("reload refused, still serving the previous configuration", extra={"fields": {"error": str(exc)}})
        return None
    if new.listen_address != running.listen_address:
        log.error("reload refused, still serving the previous configuration", extra={"fields": {
            "error": f"host and port cannot change in a reload ({running.listen_address} -> {new.listen_address}): "
                     "restart the gateway to listen elsewhere"}})
        return None
    return new


def log_listening(config: GatewayConfig, workers: int, event: str = "listening") -> None:
    log.info(event, extra={"fields": {"listen": config.listen_address, "models": len(config.models),
                                      "listed": len(config.listed), "workers": workers}})


def notify(state: str, *, quiet: bool = False) -> None:
    """systemd's readiness protocol; a socket that cannot be written is logged (unless `quiet`: around a
    reload), never fatal."""
    try:
        sd_notify(state)
    except OSError as exc:
        if not quiet:
            log.warning("cannot notify $NOTIFY_SOCKET", extra={"fields": {"error": str(exc.strerror or exc)}})
