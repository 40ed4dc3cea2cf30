"""Run the gateway (one process, or one worker of several: fleetllm_gateway.workers): report READY=1 once
the socket is bound, reload on SIGHUP, serve until SIGTERM or SIGINT. The HTTP server is httpserver.py's
protocol on the loop's own listening sockets (uvloop's when it is installed)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

from fleetllm_contract.sdnotify import sd_notify
from fleetllm_gateway import native
from fleetllm_gateway.app import Gateway
from fleetllm_gateway.busypoll import DEFAULT_LIMIT_US, BusyPoll
from fleetllm_gateway.config import ConfigError, GatewayConfig
from fleetllm_gateway.errors import GatewayError
from fleetllm_gateway.httpserver import HEADER_TIMEOUT as HEADER_TIMEOUT  # where the tests have read it
from fleetllm_gateway.httpserver import HttpServer, Request, Response, StreamResponse
from fleetllm_gateway.shared import Shared

# Imported here too, not only where the loop starts: with several workers this module is imported by the
# master before it forks them, so uvloop's modules are shared by all of them instead of imported by each.
with contextlib.suppress(ImportError):  # uvloop is optional
    import uvloop  # noqa: F401

log = logging.getLogger("gateway")

SHUTDOWN_GRACE = 5.0  # seconds in-flight requests get after SIGTERM (Supervisor's stopwaitsecs is 10)
FIRST_REQUEST_GRACE = 1.0  # seconds a connection accepted before a stop gets to send its first request
BACKLOG = 1024


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
                ready: Callable[[], None] | None = None, busy_poll_us: int = DEFAULT_LIMIT_US) -> int:
    """Serve until SIGTERM or SIGINT. Alone (no `listeners`): bind, log "listening", notify READY=1, and
    on SIGHUP reload with `reload()` (a new config, or ConfigError). As a worker: serve on the master's
    `listeners`, call `ready()` once they accept; the master logs, notifies and reloads. `busy_poll_us`:
    the longest busy-poll (fleetllm_gateway.busypoll), 0 for none."""
    loop = asyncio.get_running_loop()
    busy_poll = BusyPoll.for_loop(loop, busy_poll_us)
    current = Gateway(config, environ=os.environ, shared=shared, busy_poll=busy_poll)

    def handle(request: Request) -> Response | Awaitable[Response | StreamResponse]:  # `current` changes on reload
        return current.handle(request)

    http = HttpServer(handle, loop, busy_poll=busy_poll)
    servers: list[asyncio.AbstractServer] = []
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        if listeners:
            servers.extend([await loop.create_server(http, sock=sock, backlog=BACKLOG) for sock in listeners])
            signal.signal(signal.SIGHUP, signal.SIG_IGN)  # the master's to handle
            if ready is not None:
                ready()
            await stop.wait()
            await http.shutdown(servers, SHUTDOWN_GRACE, FIRST_REQUEST_GRACE)
            return 0
        try:
            servers.append(await loop.create_server(http, config.host or None, config.port, backlog=BACKLOG,
                                                    reuse_address=True))
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
                    previous, current = current, Gateway(new, environ=os.environ, previous=current,
                                                                 busy_poll=busy_poll)
                    previous.close()
                    log_listening(new, 1, event="reloaded")
            finally:
                notify("READY=1", quiet=True)

        loop.add_signal_handler(signal.SIGHUP, reload_now)
        await stop.wait()
        log.info("stopping")
        with contextlib.suppress(OSError):
            sd_notify("STOPPING=1")
        await http.shutdown(servers, SHUTDOWN_GRACE, FIRST_REQUEST_GRACE)
    finally:
        for server in servers:
            server.close()
        current.close()
    return 0


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
                                      "listed": len(config.listed), "workers": workers,
                                      "compiled": native.STATUS.compiled}})


def notify(state: str, *, quiet: bool = False) -> None:
    """systemd's readiness protocol; a socket that cannot be written is logged (unless `quiet`: around a
    reload), never fatal."""
    try:
        sd_notify(state)
    except OSError as exc:
        if not quiet:
            log.warning("cannot notify $NOTIFY_SOCKET", extra={"fields": {"error": str(exc.strerror or exc)}})
