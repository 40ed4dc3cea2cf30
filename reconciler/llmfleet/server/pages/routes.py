"""The status pages' blueprint: HTML pages, the JSON API behind them, login and the Approve action.

Each page and its API read the same view (`fleet_view(gather(rt))`, ...): the API is the view as JSON,
the page renders it. `?fragment=1` renders a page's live region only, which pages.js fetches to
refresh without a full reload.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from flask import (
    Blueprint,
    Flask,
    Response,
    flash,
    get_flashed_messages,
    jsonify,
    redirect,
    render_template,
    request,
    send_file,
    url_for,
)
from werkzeug.wrappers.response import Response as BaseResponse

from llmfleet.core.fleet.model import Provider
from llmfleet.core.fleet.schema import schema_dir
from llmfleet.job.approve import ApproveError
from llmfleet.logs import get_logger, log_event
from llmfleet.server.admin_api import approve_and_record
from llmfleet.server.box_api import error
from llmfleet.server.pages import session as auth
from llmfleet.server.pages.attention import attention_view
from llmfleet.server.pages.fleetview import FilterError, FleetFilter, FleetView, fleet_view, models_view
from llmfleet.server.pages.inputs import Inputs, gather
from llmfleet.server.pages.revisionview import history_view, revision_view
from llmfleet.server.pages.session import Role
from llmfleet.server.runtime import Runtime

log = get_logger("pages")
REFRESH_S = 15
MAX_FORM_BYTES = 64 * 1024
DEFAULT_PASSES, MAX_PASSES = 20, 200
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'self'; script-src 'self'; img-src 'self'; "
                               "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",  # not no-referrer: Chromium then sends `Origin: null` on our own forms
}
# verdict -> (tone, icon): the colour is the tone, and every badge also carries the icon and the word
VERDICT_LOOK = {
    "Healthy": ("ok", "check"), "Stale": ("warn", "refresh"), "Loading": ("info", "clock"),
    "Pending": ("info", "dots"), "Stalled": ("bad", "hourglass"), "Down": ("bad", "arrow-down"),
    "Foreign": ("bad", "alert"), "Missing": ("bad", "question"), "Unknown": ("muted", "question"),
    "available": ("ok", "check"), "degraded": ("warn", "alert"), "unavailable": ("bad", "cross"),
}
NOT_JUDGED_LOOK = ("muted", "dots")
PAGES = (("fleet", "/", "Fleet"), ("models", "/models", "Models"), ("revision", "/revision", "Revision"),
         ("history", "/history", "History"))
API = {"fleet": "/api/fleet", "models": "/api/models", "revision": "/api/revision", "history": "/api/passes"}


def when(ts: float | None) -> str:
    return "—" if ts is None else datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def iso(ts: float | None) -> str:
    return "" if ts is None else datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def ago(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    s = max(0, int(seconds))
    if s < 120:
        return f"{s} s ago"
    if s < 7200:
        return f"{s // 60} min ago"
    return f"{s // 3600} h ago" if s < 172800 else f"{s // 86400} days ago"


def as_json(view: Any) -> Response:
    response = jsonify(dataclasses.asdict(view))
    response.headers["Cache-Control"] = "no-store"
    return response


def build(app: Flask, rt: Runtime) -> Blueprint:
    bp = Blueprint("pages", __name__, template_folder="templates", static_folder="static",
                   static_url_path="/pages/static")
    config = rt.config
    enabled = auth.configure(app, config)
    app.jinja_env.trim_blocks = app.jinja_env.lstrip_blocks = True

    @bp.before_request
    def pages_enabled() -> Response | None:
        if enabled or request.endpoint in ("pages.static", "pages.openapi"):
            return None
        return error(404, "the status pages are off: configure viewer_tokens or admin_tokens")

    @bp.app_template_filter("when")
    def _when(ts: float | None) -> str:
        return when(ts)

    @bp.app_template_filter("iso")
    def _iso(ts: float | None) -> str:
        return iso(ts)

    @bp.app_template_filter("ago")
    def _ago(seconds: float | None) -> str:
        return ago(seconds)

    @bp.app_template_filter("short")
    def _short(revision: str | None) -> str:
        return (revision or "—")[:12]

    def role_or_none() -> Role | None:
        return auth.session_role(app, config, rt.clock())

    def page(name: str, template: str, view: Any, inputs: Inputs, role: Role) -> str:
        return render_template(template, view=view, attention=attention_view(inputs), role=str(role),
                               can_approve=role is Role.ADMIN, csrf=auth.csrf_token(), active=name, pages=PAGES,
                               fragment=request.args.get("fragment") == "1", refresh_s=REFRESH_S,
                               looks=VERDICT_LOOK, not_judged=NOT_JUDGED_LOOK, messages=get_flashed_messages(True),
                               now=inputs.now, branch=inputs.settings.branch,
                               approve_target=str(inputs.settings.approve_target), api=API[name])

    def html_view(name: str, template: str, make: Callable[[Inputs], Any], **gather_args: Any
                  ) -> Callable[[], str | BaseResponse]:
        def view() -> str | BaseResponse:
            role = role_or_none()
            if role is None:  # back here after login (the page, not a refresh fragment of it)
                back = request.path if request.args.get("fragment") == "1" else request.full_path.rstrip("?")
                return redirect(url_for("pages.login", next=back))
            inputs = gather(rt, **gather_args)
            try:
                shown = make(inputs)
            except FilterError as exc:
                return error(400, str(exc))
            return page(name, template, shown, inputs, role)
        view.__name__ = f"{name}_page"
        return view

    def api_denied() -> Response | None:
        role, presented = auth.request_role(app, config, rt.clock())
        if role is not None:
            return None
        return error(403 if presented else 401, "a viewer or admin token is required: send Authorization: "
                                                "Bearer <token>, or log in at /login")

    def api_view(make: Callable[[Inputs], Any], **gather_args: Any) -> Callable[[], Response]:
        def view() -> Response:
            if (denied := api_denied()) is not None:
                return denied
            try:
                return as_json(make(gather(rt, **gather_args)))
            except FilterError as exc:
                return error(400, str(exc))
        return view

    def filtered_fleet(inputs: Inputs) -> FleetView:
        return fleet_view(inputs, FleetFilter.parse(request.args))

    bp.add_url_rule("/", view_func=html_view("fleet", "fleet.html", filtered_fleet, boxes=True))
    bp.add_url_rule("/models", view_func=html_view("models", "models.html", models_view))
    bp.add_url_rule("/revision", view_func=html_view("revision", "revision.html", revision_view))
    bp.add_url_rule("/history", view_func=html_view("history", "history.html", history_view, passes=DEFAULT_PASSES))
    bp.add_url_rule("/api/fleet", "api_fleet", api_view(filtered_fleet, boxes=True))
    bp.add_url_rule("/api/models", "api_models", api_view(models_view))
    bp.add_url_rule("/api/attention", "api_attention", api_view(attention_view))
    bp.add_url_rule("/api/revision", "api_revision", api_view(revision_view))

    @bp.get("/api/passes")
    def api_passes() -> Response:
        if (denied := api_denied()) is not None:
            return denied
        limit = request.args.get("limit", str(DEFAULT_PASSES))
        if not limit.isascii() or not limit.isdigit() or not 0 < int(limit) <= MAX_PASSES:
            return error(400, f"limit must be an integer in 1..{MAX_PASSES}")
        return as_json(history_view(gather(rt, passes=int(limit))))

    @bp.get("/api/openapi.yaml")
    def openapi() -> Response:
        return send_file(schema_dir() / "openapi.yaml", mimetype="application/yaml", max_age=0)

    def login_page(target: str, problem: str | None = None, status: int = 200) -> tuple[str, int]:
        return render_template("login.html", csrf=auth.csrf_token(), next=target, hours=auth.SESSION_HOURS,
                               problem=problem), status

    @bp.route("/login", methods=["GET", "POST"])
    def login() -> BaseResponse | tuple[str, int]:
        request.max_content_length = MAX_FORM_BYTES  # before the form is read
        target = auth.safe_next(request.values.get("next"))
        if request.method == "GET":
            return redirect(target) if role_or_none() is not None else login_page(target)
        if not auth.csrf_ok(request.form.get("csrf")):
            return login_page(target, "The form expired: enter the token again.", 400)
        token = request.form.get("token", "").strip()
        role = auth.role_of_token(config, token or None)
        if role is None:
            log_event(log, "page login refused", logging.WARNING, peer=request.remote_addr)
            return login_page(target, "That is not a viewer or admin token of this control plane.", 403)
        auth.log_in(app, role, token, rt.clock())
        log_event(log, "page login", role=str(role), peer=request.remote_addr)
        return redirect(target)

    @bp.post("/logout")
    def logout() -> BaseResponse:
        request.max_content_length = MAX_FORM_BYTES
        if auth.csrf_ok(request.form.get("csrf")):
            auth.log_out()
        return redirect(url_for("pages.login"))

    @bp.post("/approve")
    def approve() -> BaseResponse:
        request.max_content_length = MAX_FORM_BYTES
        role = role_or_none()
        if role is None:
            return redirect(url_for("pages.login"))
        back = auth.safe_next(request.form.get("next"))
        if not auth.csrf_ok(request.form.get("csrf")):
            flash("The form expired or came from another site: nothing was approved. Try again.", "error")
            return redirect(back)
        if role is not Role.ADMIN:
            flash("Approving a box needs an admin token: log in with one.", "error")
            return redirect(back)
        host = request.form.get("host", "").strip()
        models = [m for m in request.form.getlist("model") if m]
        provider = request.form.get("provider", "")
        if not host or not models:
            flash(f"Choose at least one model to approve {host or 'the box'} with.", "error")
            return redirect(back)
        if provider not in ("", *(p.value for p in Provider)):
            flash(f"Unknown provider {provider}: choose vast, runpod or static. Nothing was approved.", "error")
            return redirect(back)
        try:
            done = approve_and_record(rt, host, models, auth.actor(), Provider(provider) if provider else None)
        except ApproveError as exc:
            flash(f"{host} was not approved: {exc}", "error")
            return redirect(back)
        flash(f"Approved {done.host} ({', '.join(models)}): commit {done.commit} on branch {done.branch}.", "ok")
        return redirect(back)

    @bp.after_request
    def headers(response: Response) -> Response:
        for name, value in SECURITY_HEADERS.items():
            response.headers.setdefault(name, value)
        if request.endpoint != "pages.static":
            response.headers["Cache-Control"] = "no-store"
        return response

    return bp


