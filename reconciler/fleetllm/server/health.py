"""GET /health (what is served, the last attempt, refresh and state-store status; 503 until a valid
revision is loaded: readiness), GET /health/live (200 while the process answers requests at all, whatever
it serves: liveness and start-up) and GET /metrics (Prometheus text). None carries a secret; the two
health views are public, /metrics too unless metrics_token is set (it names every box and pod): then only
for that bearer (fleetllm.core.secret.metrics_refusal)."""

from __future__ import annotations

from flask import Blueprint, Response, jsonify, request

from fleetllm.core.control import ControlState
from fleetllm.core.secret import LIVE_PATH, METRICS_CHALLENGE, metrics_refusal
from fleetllm.errors import StateError
from fleetllm.server.metrics import CONTENT_TYPE
from fleetllm.server.rollouts import rollout_summary
from fleetllm.server.runtime import current_runtime

bp = Blueprint("health", __name__)


@bp.get("/health")
def health() -> Response:
    rt = current_runtime()
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
        "control": control_summary(rt.control),
    }
    try:
        rollout = rollout_summary(rt)  # the box list is for token holders (GET /admin/rollout)
    except StateError:  # /health answers while the state store is down (state.fetch_log_error says so)
        rollout = {"error": "the state store cannot be read"}
    if rollout is not None:
        body["rollout"] = rollout
    if served and served.render_errors:
        body["render_errors"] = dict(served.render_errors)
    response = jsonify(body)
    response.status_code = 200 if served else 503
    response.headers["Cache-Control"] = "no-store"
    return response


@bp.get(LIVE_PATH)
def live() -> Response:
    """The pods' liveness and start-up probe (deploy/): through the request threads like any view, but
    public and the same whatever is served (a bad commit must not restart a pod serving the last good one)."""
    response = jsonify({"status": "alive", "replica": current_runtime().replica})
    response.headers["Cache-Control"] = "no-store"
    return response


def control_summary(state: ControlState) -> dict[str, object]:
    """The operator controls in force (as this replica last read them, within a few seconds): whether
    the fleet is suspended, and the pinned revision; who and when, never a token."""
    return {"suspended": state.suspended is not None,
            "suspended_at": state.suspended.at if state.suspended else None,
            "suspended_by": state.suspended.actor if state.suspended else None,
            "pinned_revision": state.pin.revision if state.pin else None,
            "pinned_at": state.pin.at if state.pin else None,
            "pinned_by": state.pin.actor if state.pin else None,
            "sync_requested": state.sync is not None}


@bp.get("/metrics")
def metrics() -> Response:
    rt = current_runtime()
    refusal = metrics_refusal(rt.config.metrics_token, request.headers.get("Authorization"))
    if refusal is not None:
        response = jsonify({"error": refusal[1]})
        response.status_code = refusal[0]
        if refusal[0] == 401:
            response.headers["WWW-Authenticate"] = METRICS_CHALLENGE
        return response
    return Response(rt.metrics.exposition(), content_type=CONTENT_TYPE)
