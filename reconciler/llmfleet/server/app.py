"""The Flask application factory: `create_app(runtime)` wires the endpoints to one Runtime."""

from __future__ import annotations

import logging

from flask import Flask, Response, jsonify
from werkzeug.exceptions import HTTPException

from llmfleet.errors import StateError
from llmfleet.logs import get_logger, log_event
from llmfleet.server import admin_api, box_api, pages
from llmfleet.server.box_api import error
from llmfleet.server.metrics import CONTENT_TYPE
from llmfleet.server.runtime import Runtime

log = get_logger("app")


def health(rt: Runtime) -> Response:
    served = rt.tracker.served
    attempted = rt.tracker.attempted
    refresh = rt.tracker.refresh_status
    body: dict[str, object] = {
        "status": "ok" if served else "unavailable",
        "revision": served.revision if served else None,  # replicas agree when they name the same commit
        "replica": rt.replica,
        "started_at": rt.started_at,
        "branch": rt.repo.branch,
        "hosts": len(served.fleet.boxes) if served else 0,
        "servers": served.fleet.server_count if served else 0,
        "applied_at": rt.tracker.applied_at,
        "last_attempted": None if attempted is None else {
            "revision": attempted.revision, "valid": attempted.valid, "errors": list(attempted.errors),
            "at": attempted.at},
        "last_refresh": {"ok_at": refresh.ok_at, "error": refresh.error, "error_at": refresh.error_at},
        "state": {"backend": rt.store.backend, "fetch_log_error": rt.store.flush_error},
    }
    if served and served.render_errors:
        body["render_errors"] = dict(served.render_errors)
    response = jsonify(body)
    response.status_code = 200 if served else 503
    response.headers["Cache-Control"] = "no-store"
    return response


def create_app(rt: Runtime) -> Flask:
    app = Flask("llmfleet", static_folder=None)  # no /static from the working directory; pages ship their own
    app.json.sort_keys = False  # type: ignore[attr-defined]
    app.extensions["llmfleet"] = rt
    box_api.register(app, rt)
    admin_api.register(app, rt)
    pages.register(app, rt)

    @app.get("/health")
    def health_route() -> Response:
        return health(rt)

    @app.get("/metrics")
    def metrics_route() -> Response:
        return Response(rt.metrics.exposition(), content_type=CONTENT_TYPE)

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException) -> Response:
        return error(exc.code or 500, exc.description or exc.name)

    @app.errorhandler(StateError)
    def state_error(exc: StateError) -> Response:  # the database is down: the box or operator retries
        log_event(log, "state store error", logging.ERROR, error=str(exc))
        return error(503, "the control plane's state store is unavailable; retry later")

    @app.errorhandler(Exception)
    def unexpected(exc: Exception) -> Response:
        log_event(log, "unhandled error", logging.ERROR, error=type(exc).__name__)
        return error(500, "internal error; see the control plane's log")

    return app
