"""Operator controls of the whole fleet without a commit (issue 18): sync now, suspend, resume, pin, unpin.

    GET  /admin/control   what is in force, and the audit trail                  (viewer and up)
    POST /admin/sync      {"reason"?}: ask the reconcile loop for a pass now     (operator, admin)
    POST /admin/suspend   {"reason"?}: passes observe and record, act on nothing  (operator, admin)
    POST /admin/resume    {"reason"?}                                              (operator, admin)
    POST /admin/pin       {"revision", "reason"?}: serve that valid revision      (operator, admin)
    POST /admin/unpin     {"reason"?}                                              (operator, admin)

Everything goes through the state store (fleetllm.adapters.state.control), so it holds for every replica
and for a reconcile loop in another process or on another machine: a sync request is a row the loop
takes within a second or two; a pin is read by every replica within CONTROL_POLL_S (this one at once).
Each action is audited (who: the token's name or fingerprint, or the person signed in; when; why). The
status pages' buttons call the same functions (fleetllm.server.pages.control); `fleetllm sync|suspend|
resume|pin|unpin` call this API.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict
from typing import Any

from flask import Blueprint, Response, current_app, jsonify, request

from fleetllm.core.control import ControlState, clean_reason
from fleetllm.logs import get_logger, log_event
from fleetllm.server.access import current_caller, requires
from fleetllm.server.auth import Role
from fleetllm.server.errors import NO_STORE, error
from fleetllm.server.ratelimit import LoginLimiter
from fleetllm.server.revisions import PinError
from fleetllm.server.runtime import Runtime, current_runtime

log = get_logger("control")
bp = Blueprint("control", __name__)
MAX_BODY_BYTES = 16 * 1024
AUDIT_SHOWN = 50
MAX_PIN_ERRORS_SHOWN = 5


def control_json(rt: Runtime, state: ControlState | None = None, audit: int = AUDIT_SHOWN) -> dict[str, Any]:
    """What is in force, the served and newest valid revisions, and the newest audit entries."""
    state = state if state is not None else rt.store.control()
    served, newest = rt.tracker.served, rt.tracker.newest_valid
    return {"suspended": asdict(state.suspended) if state.suspended else None,
            "pin": asdict(state.pin) if state.pin else None,
            "sync_requested": asdict(state.sync) if state.sync else None,
            "served_revision": served.revision if served else None,
            "newest_valid_revision": newest.revision if newest else None,
            "audit": [{**asdict(e), "action": e.action.value} for e in rt.store.control_audit(audit)] if audit else []}


def sync(rt: Runtime, actor: str, reason: str) -> bool:
    """Refresh the tracked branch (as the push webhook does) and ask the reconcile loop for a pass now.
    Returns whether the served revision changed."""
    changed = rt.tracker.refresh()
    rt.store.request_sync(actor, rt.clock(), reason)
    rt.refresh_control()
    log_event(log, "sync requested", actor=actor, reason=clean_reason(reason), refreshed_changed=changed)
    return changed


def suspend(rt: Runtime, actor: str, reason: str) -> bool:
    done = rt.store.suspend(actor, rt.clock(), reason)
    rt.refresh_control()
    if done:
        log_event(log, "fleet suspended", logging.WARNING, actor=actor, reason=clean_reason(reason))
    return done


def resume(rt: Runtime, actor: str, reason: str) -> bool:
    done = rt.store.resume(actor, rt.clock(), reason)
    rt.refresh_control()
    if done:
        log_event(log, "fleet resumed", actor=actor, reason=clean_reason(reason))
    return done


def pin(rt: Runtime, revision: str, actor: str, reason: str) -> str:
    """Pin the fleet to `revision` once it is known to be a valid commit of the branch's history (PinError
    otherwise); returns the full commit id."""
    rendered = rt.tracker.pinnable(revision.strip())
    rt.store.pin(rendered.revision, actor, rt.clock(), reason)
    rt.refresh_control()
    log_event(log, "fleet pinned", logging.WARNING, actor=actor, revision=rendered.revision,
              reason=clean_reason(reason))
    return rendered.revision


def unpin(rt: Runtime, actor: str, reason: str) -> bool:
    done = rt.store.unpin(actor, rt.clock(), reason)
    rt.refresh_control()
    if done:
        log_event(log, "fleet unpinned", actor=actor, reason=clean_reason(reason))
    return done


def pin_error_text(exc: PinError) -> str:
    shown = "; ".join(exc.errors[:MAX_PIN_ERRORS_SHOWN])
    more = f" (+{len(exc.errors) - MAX_PIN_ERRORS_SHOWN} more)" if len(exc.errors) > MAX_PIN_ERRORS_SHOWN else ""
    return f"{exc}: {shown}{more}" if shown else str(exc)


def _body() -> dict[str, Any] | Response:
    """The JSON object sent (an empty body is an empty object), or the 400 answer."""
    request.max_content_length = MAX_BODY_BYTES
    if not request.get_data(cache=True):
        return {}
    payload = request.get_json(silent=True)
    if not isinstance(payload, dict):
        return error(400, 'send a JSON object, e.g. {"reason": "why"}')
    if "reason" in payload and not isinstance(payload["reason"], str):
        return error(400, '"reason" must be a string')
    return payload


def _actor() -> str:
    return current_caller().actor


def _answer(status: str, code: int = 200, **extra: Any) -> Response:
    response = jsonify({"status": status, **extra, "control": control_json(current_runtime(), audit=0)})
    response.status_code = code
    response.headers["Cache-Control"] = NO_STORE
    return response


@bp.get("/admin/control")
@requires(Role.VIEWER)
def get_control() -> Response:
    response = jsonify(control_json(current_runtime()))
    response.headers["Cache-Control"] = NO_STORE
    return response


SYNC_LIMITER = "fleetllm.sync_limiter"  # app.extensions key: per app, as tests run many apps in one process
# Per caller (the token or session's actor) and in all: a CI job's retries pass, a loop does not.
SYNC_LIMITS = {"peer_per_minute": 6, "peer_burst": 5, "global_per_minute": 30, "global_burst": 20}


@bp.post("/admin/sync")
@requires(Role.OPERATOR, action="Sync")
def post_sync() -> Response:
    body = _body()
    if isinstance(body, Response):
        return body
    rt = current_runtime()
    actor = _actor()
    limiter = current_app.extensions.setdefault(SYNC_LIMITER, LoginLimiter(**SYNC_LIMITS))
    verdict = limiter.allow(actor, time.monotonic())
    if not verdict.allowed:  # each sync fetches the fleet repository and writes the audit trail
        if verdict.first_refusal:
            log_event(log, "sync refused", logging.WARNING, actor=actor, scope=verdict.scope,
                      retry_after_s=verdict.retry_after_s)
        refused = error(429, f"too many sync requests ({verdict.scope}): a pass is already asked for; "
                             f"try again in {verdict.retry_after_s} s")
        refused.headers["Retry-After"] = str(verdict.retry_after_s)
        return refused
    changed = sync(rt, actor, body.get("reason") or "")
    status = rt.tracker.refresh_status
    return _answer("requested", 202, refreshed=changed, refresh_error=status.error)


@bp.post("/admin/suspend")
@requires(Role.OPERATOR, action="Suspending the fleet")
def post_suspend() -> Response:
    body = _body()
    if isinstance(body, Response):
        return body
    done = suspend(current_runtime(), _actor(), body.get("reason") or "")
    return _answer("suspended" if done else "already suspended")


@bp.post("/admin/resume")
@requires(Role.OPERATOR, action="Resuming the fleet")
def post_resume() -> Response:
    body = _body()
    if isinstance(body, Response):
        return body
    done = resume(current_runtime(), _actor(), body.get("reason") or "")
    return _answer("resumed" if done else "not suspended")


@bp.post("/admin/pin")
@requires(Role.OPERATOR, action="Pinning the fleet")
def post_pin() -> Response:
    body = _body()
    if isinstance(body, Response):
        return body
    revision = body.get("revision")
    if not isinstance(revision, str) or not revision.strip():
        return error(400, 'send JSON {"revision": "<commit of the tracked branch>", "reason": "why"}')
    try:
        full = pin(current_runtime(), revision, _actor(), body.get("reason") or "")
    except PinError as exc:
        return error(exc.status, pin_error_text(exc))
    return _answer("pinned", revision=full)


@bp.post("/admin/unpin")
@requires(Role.OPERATOR, action="Unpinning the fleet")
def post_unpin() -> Response:
    body = _body()
    if isinstance(body, Response):
        return body
    done = unpin(current_runtime(), _actor(), body.get("reason") or "")
    return _answer("unpinned" if done else "not pinned")
