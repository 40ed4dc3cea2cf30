"""How the control plane answers what went wrong, in one place, by surface (fleetllm.server.access.Surface).

    box contract and APIs   JSON {"error": "<what went wrong and what to do>"} (schemas/openapi.yaml `Error`)
    status pages            error.html: the status, its name and the same sentence
    refusals                APIs: JSON 401 (with WWW-Authenticate: Bearer), 403 or 404;
                            pages: a redirect to /login, or back to the page with the reason flashed;
                            the box API records its refusals like every box answer (box_api.refused)

Never a traceback and never a secret: an unexpected exception is logged by its type only and answered
as a 500; a failing state store is a 503 the caller may retry.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from flask import Blueprint, Response, flash, jsonify, redirect, render_template, request, url_for
from werkzeug.exceptions import HTTPException
from werkzeug.http import HTTP_STATUS_CODES
from werkzeug.wrappers.response import Response as BaseResponse

from fleetllm.errors import StateError
from fleetllm.logs import get_logger, log_event
from fleetllm.server.access import Refused, Surface, surface
from fleetllm.server.session import safe_next

log = get_logger("app")
bp = Blueprint("errors", __name__)
NO_STORE = "no-store"
WWW_AUTHENTICATE = 'Bearer realm="fleetllm"'  # RFC 9110 15.5.2: a 401 names the scheme to use (RFC 6750)
# Every HTML answer (the pages' blueprint adds them to its own; error pages may have matched no route)
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'self'; script-src 'self'; img-src 'self'; "
                               "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",  # not no-referrer: Chromium then sends `Origin: null` on our own forms
}


def error(status: int, message: str) -> Response:
    """The JSON error answer of every API: {"error": message}."""
    response = jsonify({"error": message})
    response.status_code = status
    return response


def error_page(status: int, message: str) -> Response:
    """The HTML error answer of the status pages (JSON should the page itself fail to render)."""
    try:
        html = render_template("error.html", status=status, title=HTTP_STATUS_CODES.get(status, "Error"),
                               message=message)
    except Exception as exc:  # an error page must not fail in turn
        log_event(log, "error page failed", logging.ERROR, error=type(exc).__name__)
        return error(status, message)
    response = Response(html, status=status, mimetype="text/html")
    response.headers.update(SECURITY_HEADERS)
    response.headers["Cache-Control"] = NO_STORE
    return response


def answer(status: int, message: str, headers: Iterable[tuple[str, str]] = ()) -> Response:
    """An error, as the current request's surface shows one."""
    response = error_page(status, message) if surface() is Surface.PAGE else error(status, message)
    for name, value in headers:
        if name.lower() != "content-type":
            response.headers[name] = value
    return response


@bp.app_errorhandler(HTTPException)
def http_error(exc: HTTPException) -> Response:
    """404, 405 (with its Allow header), 413, 400, ... raised by routing, request parsing or a view."""
    return answer(exc.code or 500, exc.description or exc.name, exc.get_headers())


@bp.app_errorhandler(Refused)
def refused(exc: Refused) -> Response | BaseResponse:
    status, message = exc.code or 403, exc.description or exc.name
    if surface() is not Surface.PAGE:
        response = error(status, message)
        if status == 401:
            response.headers["WWW-Authenticate"] = WWW_AUTHENTICATE
        return response
    if status == 401:  # not logged in: log in, then back here (the page, not a refresh fragment of it)
        if request.method not in ("GET", "HEAD"):
            return redirect(url_for("pages.login"))
        here = request.path if request.args.get("fragment") == "1" else request.full_path.rstrip("?")
        return redirect(url_for("pages.login", next=here))
    flash(message, "error")
    back: str | None
    try:
        back = request.form.get("next")
    except HTTPException:  # a form over the pages' limit: back to the fleet
        back = None
    return redirect(safe_next(back))


@bp.app_errorhandler(StateError)
def state_error(exc: StateError) -> Response:  # the database is down: the box or operator retries
    log_event(log, "state store error", logging.ERROR, error=str(exc))
    return answer(503, "the control plane's state store is unavailable; retry later")


@bp.app_errorhandler(Exception)
def unexpected(exc: Exception) -> Response:
    log_event(log, "unhandled error", logging.ERROR, error=type(exc).__name__)
    return answer(500, "internal error; see the control plane's log")
