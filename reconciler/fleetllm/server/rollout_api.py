"""The staged rollout's admin API (issue 14), used by `fleetllm rollout`:

    GET  /admin/rollout            the rollout: target, state, waves, each box's release   (viewer and up)
    POST /admin/rollout/pause      stop releasing boxes (draining boxes are routed again)  (operator, admin)
    POST /admin/rollout/resume     go on (a halted rollout retries its halted box)        (operator, admin)
    POST /admin/rollout/abort      stop, and roll released but unconverged boxes back     (operator, admin)
    POST /admin/rollout/forget     {"box": B}: retire a box that left the placement now   (operator, admin)

A request is recorded in the state store and taken by the next reconcile pass (the pass holds the
single-flight lock; the API never runs one), so it works the same with several replicas. Each request
also goes to the controls' audit trail (who, when, the target revision). The status pages' rollout
buttons call `request_action` too (fleetllm.server.pages.control).
"""

from __future__ import annotations

import logging

from flask import Blueprint, Response, jsonify, request

from fleetllm.core.control import ControlAction
from fleetllm.core.rollout.control import Request, apply_request, refusal
from fleetllm.core.rollout.retire import forgotten
from fleetllm.logs import get_logger, log_event
from fleetllm.server.access import current_caller, requires
from fleetllm.server.auth import Role
from fleetllm.server.errors import error
from fleetllm.server.rollouts import retirement_json, rollout_status
from fleetllm.server.runtime import Runtime, current_runtime

log = get_logger("admin")
MAX_BOX_CHARS = 256
bp = Blueprint("rollout", __name__)


@bp.get("/admin/rollout")
@requires(Role.VIEWER)
def rollout() -> Response:
    rt = current_runtime()
    return jsonify({"rollout": rollout_status(rt),
                    "history": [{"target": r.target, "state": str(r.state), "reason": r.reason, "waves": r.waves,
                                 "started_at": r.started_at, "updated_at": r.updated_at}
                                for r in rt.store.recent_rollouts(10)]})


AUDITED = {Request.PAUSE: ControlAction.ROLLOUT_PAUSE, Request.RESUME: ControlAction.ROLLOUT_RESUME,
           Request.ABORT: ControlAction.ROLLOUT_ABORT}


def request_action(rt: Runtime, wanted: Request, actor: str) -> str | None:
    """Record `actor`'s request for the next pass, and in the audit trail; returns why it cannot apply to the
    rollout as it stands (then nothing is recorded), else None."""
    current, pending, _ = rt.store.current_rollout()
    effective = apply_request(current, pending, actor, rt.clock()) if current and pending else current
    why = refusal(effective, wanted)
    if why is not None:
        return why
    rt.store.request_rollout(wanted, actor)
    target = effective.target if effective else None
    rt.store.record_control(AUDITED[wanted], actor, rt.clock(), revision=target)
    log_event(log, "rollout request", logging.WARNING if wanted is Request.ABORT else logging.INFO,
              request=str(wanted), actor=actor, target=target)
    return None


@bp.post("/admin/rollout/forget")
@requires(Role.OPERATOR, action="Forgetting a box")
def forget() -> Response:
    """`fleetllm rollout forget BOX`: retire a box that left the placement at once (core.rollout.retire)."""
    rt = current_runtime()
    payload = request.get_json(silent=True)
    box = payload.get("box") if isinstance(payload, dict) else None
    if not isinstance(box, str) or not box or len(box) > MAX_BOX_CHARS:
        return error(400, 'send JSON {"box": "<the box name>"}')
    served = rt.tracker.served
    if served is not None and box in served.fleet.boxes:
        return error(409, f"box {box!r} is in the placement at revision {served.revision[:12]}: remove it from "
                          "placement.yaml first (it then drains and retires by itself)")
    retirements = rt.store.retirements()
    if box not in retirements and rt.store.box_release(box) is None and rt.store.latest_report(box) is None:
        return error(404, f"the control plane knows no box {box!r} (no release, report or retirement)")
    actor = current_caller().actor
    record = forgotten(box, retirements.get(box), served.revision if served is not None else "", rt.clock(), actor)
    rt.store.forget_box(record, actor, rt.clock())
    log_event(log, "box forgotten", logging.WARNING, box=box, actor=actor, left_at_revision=record.revision)
    return jsonify({"box": box, "by": actor, "retirement": retirement_json(record)})


@bp.post("/admin/rollout/<action>")
@requires(Role.OPERATOR, action="Controlling the rollout")
def control(action: str) -> Response:
    if action not in {r.value for r in Request}:
        return error(404, f"no rollout action {action!r}: pause, resume or abort")
    rt = current_runtime()
    actor = current_caller().actor
    why = request_action(rt, Request(action), actor)
    if why is not None:
        return error(409, f"cannot {action} the rollout: {why}")
    response = jsonify({"requested": action, "by": actor, "rollout": rollout_status(rt),
                        "note": "the next reconcile pass applies it"})
    response.status_code = 202
    return response
