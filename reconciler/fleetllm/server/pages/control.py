"""The operator controls on the status pages: the banner every page shows (suspended, pinned in red,
a sync waiting) with its audit trail, and its admin forms (Sync now, Suspend, Resume, Pin, Unpin),
which post here with the page's CSRF token and call what POST /admin/* calls (control_api.py).

Registered on the pages' blueprint (session login, CSRF, security headers); importing this module
adds the routes (fleetllm.server.app imports it).
"""

from __future__ import annotations

from typing import Any

from flask import flash, g, redirect, request
from werkzeug.wrappers.response import Response as BaseResponse

from fleetllm.server import control_api
from fleetllm.server import session as auth
from fleetllm.server.access import requires
from fleetllm.server.auth import Role
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
            "can_control": g.fleetllm_role is Role.ADMIN}


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
@requires(Role.ADMIN, action="Sync")
def page_sync() -> BaseResponse:
    form = _form()
    if form is None:
        return redirect(_back())
    back, reason = form
    control_api.sync(current_runtime(), auth.actor(), reason)
    flash("Sync requested: the tracked branch was re-read and the reconciler runs a pass within seconds.", "ok")
    return redirect(back)


@bp.post("/control/suspend")
@requires(Role.ADMIN, action="Suspending the fleet")
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
@requires(Role.ADMIN, action="Resuming the fleet")
def page_resume() -> BaseResponse:
    form = _form()
    if form is None:
        return redirect(_back())
    back, reason = form
    done = control_api.resume(current_runtime(), auth.actor(), reason)
    flash("The fleet is resumed." if done else "The fleet was not suspended.", "ok")
    return redirect(back)


@bp.post("/control/pin")
@requires(Role.ADMIN, action="Pinning the fleet")
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
@requires(Role.ADMIN, action="Unpinning the fleet")
def page_unpin() -> BaseResponse:
    form = _form()
    if form is None:
        return redirect(_back())
    back, reason = form
    done = control_api.unpin(current_runtime(), auth.actor(), reason)
    flash("The pin is removed: boxes get the newest valid revision again." if done else "The fleet was not pinned.",
          "ok")
    return redirect(back)
