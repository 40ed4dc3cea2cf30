"""The access log of pages and APIs: one `request` line per answer, written by a WSGI wrapper around
the app (so 404s, 405s and refusals are logged like the rest).

    {"ts":...,"level":"info","logger":"fleetllm.access","event":"request","method":"GET","path":"/history",
     "query":["page"],"status":200,"bytes":5120,"ms":3.1,"peer":"127.0.0.1","role":"viewer"}

`path` is the app's route that answered (its rule, e.g. `/admin/reports`), never the raw path a client
sent: an unknown path is logged as null, since a client can put anything in it (`GET /<fleet key>`
from a mistyped command), and a route with variables would be logged as its rule.
What it never holds: a query string's values (only the parameter names: a token pasted into a URL stays
out), a header (Authorization, Cookie), a body (the login form), a token, a cookie or the fleet key.
`role` is what the request was granted (`access.requires` notes it: viewer, admin), else "none".
The box contract's endpoints (/vllm/*) are not logged here: the box blueprint writes its own `box request`
line for each answer, with what a box request needs (box, host source, revision).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any
from urllib.parse import parse_qsl

from flask import Flask, request

from fleetllm.logs import get_logger, log_event

log = get_logger("access")
ROLE_KEY = "fleetllm.role"  # in the WSGI environment: the role `requires` granted
ROUTE_KEY = "fleetllm.route"  # in the WSGI environment: the rule of the route that matched
BOX_PREFIX = "/vllm/"  # logged by the box blueprint ("box request")

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def query_names(query: str) -> list[str]:
    """The parameter names of a query string, in order, once each; never a value."""
    names: list[str] = []
    for name, _ in parse_qsl(query, keep_blank_values=True):
        if name not in names:
            names.append(name)
    return names


def _note_route() -> None:
    rule = request.url_rule
    if rule is not None:
        request.environ[ROUTE_KEY] = rule.rule


def access_logged(app: WsgiApp) -> WsgiApp:
    """`app`, with one access-log line per answer outside /vllm/*. A Flask app gets a first
    before_request hook that notes the matched route (it runs for unrouted requests too)."""
    if isinstance(app, Flask):
        app.before_request_funcs.setdefault(None, []).insert(0, _note_route)

    def logged(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if str(environ.get("PATH_INFO", "")).startswith(BOX_PREFIX):
            return app(environ, start_response)
        started = time.perf_counter()
        status = [0]

        def start(line: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            status[0] = int(line[:3]) if line[:3].isdigit() else 0
            return start_response(line, headers, exc_info)

        try:
            body = app(environ, start)
        except Exception:
            _log(environ, 500, 0, started)
            raise
        return _counted(body, lambda sent: _log(environ, status[0], sent, started))

    return logged


def _counted(body: Iterable[bytes], done: Callable[[int], None]) -> Iterator[bytes]:
    sent = 0
    try:
        for chunk in body:
            sent += len(chunk)
            yield chunk
    finally:
        close = getattr(body, "close", None)
        if close is not None:
            close()
        done(sent)


def _log(environ: dict[str, Any], status: int, sent: int, started: float) -> None:
    log_event(log, "request", logging.WARNING if status >= 500 else logging.INFO,
              method=str(environ.get("REQUEST_METHOD", "")), path=environ.get(ROUTE_KEY),
              query=query_names(str(environ.get("QUERY_STRING", ""))), status=status, bytes=sent,
              ms=round((time.perf_counter() - started) * 1000, 2), peer=environ.get("REMOTE_ADDR"),
              role=environ.get(ROLE_KEY, "none"))
