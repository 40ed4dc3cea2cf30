"""The operator controls on the status pages: the banner every page shows (suspended, pinned in red,
a sync waiting) with its audit trail, and its forms for operators and admins (Sync now, Suspend, Resume,
Pin, Unpin; on the Revision page, the rollout's Pause, Resume and Abort), which post here with the
page's CSRF token and call what POST /admin/* calls (control_api.py, rollout_api.py).

Registered on the pages' blueprint (session login, CSRF, security headers); importing this module
adds the routes (fleetllm.server.app imports it).
"""

from __future__ import annotations

from typing import Any

from flask import flash, g, redirect, request
from werkzeug.wrappers.response import Response as BaseResponse

from fleetllm.core.rollout.control import Request
from fleetllm.server import control_api, rollout_api
from fleetllm.server import session as auth
from fleetllm.server.access import requires
from fleetllm.server.auth import Role, covers
from fleetllm.server.pages.routes import bp
from fleetllm.server.revisions import PinError
from fleetllm.server.runtime import current_runtime

AUDIT_ON_PAGES = 10


@bp.context_processor
def control_banner() -> dict[str, Any]:
    """`control` for _control.html: what is in force and the newest audit entries (read from the store on
    each page, so the banner is never behind)."""
    if getattr(g, "fleetllm_role", None) is None:  # login and error pages: no banner
        return {"control": None}
    return {"control": control_api.control_json(current_runtime(), audit=AUDIT_ON_PAGES),
            "can_control": covers(g.fleetllm_role, Role.OPERATOR)}


def _form() -> tuple[str, str] | None:
    """(where to go back to, the reason) once the CSRF token checks out; else None, with the flash said."""
    back = auth.safe_next(request.form.get("next"))
    if not auth.csrf_ok(request.form.get("csrf")):
        flash("The form expired or came from another site: nothing was done. Try again.", "error")
        return None
    return back, request.form.get("reason", "")


def _back() -> str:
    return auth.safe_next(request.form.get("next"))


@bp.post("/control/sync")
@requires(Role.OPERATOR, action="Sync")
def page_sync() -> BaseResponse:
    form = _form()
    if form is None:
        return redirect(_back())
    back, reason = form
    control_api.sync(current_runtime(), auth.actor(), reason)
    flash("Sync requested: the tracked branch was re-read and the reconciler runs a pass within seconds.", "ok")
    return redirect(back)


@bp.post("/control/suspend")
@requires(Role.OPERATOR, action="Suspending the fleet")
def page_suspend() -> BaseResponse:
    form = _form()
    if form is None:
        return redirect(_back())
    back, reason = form
    done = control_api.suspend(current_runtime(), auth.actor(), reason)
    flash("The fleet is suspended: passes observe and record, and change nothing." if done else
          "The fleet was already suspended.", "ok")
    return redirect(back)


@bp.post("/control/resume")
@requires(Role.OPERATOR, action="Resuming the fleet")
def page_resume() -> BaseResponse:
    form = _form()
    if form is None:
        return redirect(_back())
    back, reason = form
    done = control_api.resume(current_runtime(), auth.actor(), reason)
    flash("The fleet is resumed." if done else "The fleet was not suspended.", "ok")
    return redirect(back)


@bp.post("/control/pin")
@requires(Role.OPERATOR, action="Pinning the fleet")
def page_pin() -> BaseResponse:
    form = _form()
    if form is None:
        return redirect(_back())
    back, reason = form
    try:
        full = control_api.pin(current_runtime(), request.form.get("revision", ""), auth.actor(), reason)
    except PinError as exc:
        flash(f"Not pinned: {control_api.pin_error_text(exc)}", "error")
        return redirect(back)
    flash(f"The fleet is pinned to {full[:12]}: every box is served that revision until unpinned.", "ok")
    return redirect(back)


@bp.post("/control/unpin")
@requires(Role.OPERATOR, action="Unpinning the fleet")
def page_unpin() -> BaseResponse:
    form = _form()
    if form is None:
        return redirect(_back())
    back, reason = form
    done = control_api.unpin(current_runtime(), auth.actor(), reason)
    flash("The pin is removed: boxes get the newest valid revision again." if done else "The fleet was not pinned.",
          "ok")
    return redirect(back)


ROLLOUT_DONE = {Request.PAUSE: "Pause requested: the next reconcile pass stops releasing boxes.",
                Request.RESUME: "Resume requested: the next reconcile pass goes on with the rollout.",
                Request.ABORT: "Abort requested: the next reconcile pass stops the rollout and rolls released, "
                               "unconverged boxes back."}


@bp.post("/control/rollout/<action>")
@requires(Role.OPERATOR, action="Controlling the rollout")
def page_rollout(action: str) -> BaseResponse:
    form = _form()
    if form is None:
        return redirect(_back())
    back, _ = form
    if action not in {r.value for r in Request}:
        flash(f"No rollout action {action[:20]!r}: pause, resume or abort. Nothing was done.", "error")
        return redirect(back)
    wanted = Request(action)
    why = rollout_api.request_action(current_runtime(), wanted, auth.actor())
    if why is not None:
        flash(f"Cannot {action} the rollout: {why}.", "error")
    else:
        flash(ROLLOUT_DONE[wanted], "ok")
    return redirect(back)
