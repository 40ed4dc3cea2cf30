"""The staged rollout's admin API (issue 14), used by `fleetllm rollout`:

    GET  /admin/rollout            the rollout: target, state, waves, each box's release   (viewer or admin)
    POST /admin/rollout/pause      stop releasing boxes (draining boxes are routed again)  (admin)
    POST /admin/rollout/resume     go on (a halted rollout retries its halted box)        (admin)
    POST /admin/rollout/abort      stop, and roll released but unconverged boxes back     (admin)

A request is recorded in the state store and taken by the next reconcile pass (the pass holds the
single-flight lock; the API never runs one), so it works the same with several replicas.
"""

from __future__ import annotations

import logging

from flask import Blueprint, Response, jsonify, request

from fleetllm.core.rollout.control import Request, apply_request, refusal
from fleetllm.logs import get_logger, log_event
from fleetllm.server.access import requires
from fleetllm.server.auth import Role, bearer_token, token_fingerprint
from fleetllm.server.errors import error
from fleetllm.server.rollouts import rollout_status
from fleetllm.server.runtime import current_runtime

log = get_logger("admin")
bp = Blueprint("rollout", __name__)


@bp.get("/admin/rollout")
@requires(Role.VIEWER)
def rollout() -> Response:
    rt = current_runtime()
    return jsonify({"rollout": rollout_status(rt),
                    "history": [{"target": r.target, "state": str(r.state), "reason": r.reason, "waves": r.waves,
                                 "started_at": r.started_at, "updated_at": r.updated_at}
                                for r in rt.store.recent_rollouts(10)]})


@bp.post("/admin/rollout/<action>")
@requires(Role.ADMIN, action="Controlling the rollout")
def control(action: str) -> Response:
    if action not in {r.value for r in Request}:
        return error(404, f"no rollout action {action!r}: pause, resume or abort")
    rt = current_runtime()
    wanted = Request(action)
    current, pending, _ = rt.store.current_rollout()
    actor = "admin:" + token_fingerprint(bearer_token(request.headers.get("Authorization")) or "")
    effective = apply_request(current, pending, actor, rt.clock()) if current and pending else current
    why = refusal(effective, wanted)
    if why is not None:
        return error(409, f"cannot {action} the rollout: {why}")
    rt.store.request_rollout(wanted, actor)
    log_event(log, "rollout request", logging.WARNING if wanted is Request.ABORT else logging.INFO,
              request=action, actor=actor, target=effective.target if effective else None)
    response = jsonify({"requested": action, "by": actor, "rollout": rollout_status(rt),
                        "note": "the next reconcile pass applies it"})
    response.status_code = 202
    return response
