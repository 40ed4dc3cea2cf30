"""The status pages' blueprint: HTML pages, the JSON API behind them, login (a token here, single sign-on
in fleetllm.server.pages.sso) and the Approve action.

Each page and its API read the same view (`fleet_view(gather(rt))`, ...): the API is the view as JSON,
the page renders it. `?fragment=1` renders a page's live region only, which pages.js fetches to
refresh without a full reload. Pages and API need a viewer (`requires(Role.VIEWER)`); a page without a
session is sent to /login, the API answers 401/403 JSON (fleetllm.server.errors).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, cast

from flask import (
    Blueprint,
    Flask,
    Response,
    current_app,
    flash,
    get_flashed_messages,
    jsonify,
    redirect,
    render_template,
    request,
    url_for,
)
from flask.blueprints import BlueprintSetupState
from werkzeug.wrappers.response import Response as BaseResponse

from fleetllm.core.fleet.approve import ApproveError
from fleetllm.core.fleet.model import Provider
from fleetllm.core.hosts import resolve_host
from fleetllm.logs import get_logger, log_event
from fleetllm.server import session as auth
from fleetllm.server.access import current_role, requires
from fleetllm.server.admin_api import approve_and_record
from fleetllm.server.auth import Role, covers, token_caller
from fleetllm.server.errors import NO_STORE, SECURITY_HEADERS, error
from fleetllm.server.guard import is_exempt, peer_key
from fleetllm.server.openapi import served_document
from fleetllm.server.pages.attention import attention_view
from fleetllm.server.pages.fleetview import FilterError, FleetFilter, FleetView, fleet_view, models_view
from fleetllm.server.pages.inputs import Inputs, gather
from fleetllm.server.pages.revisionview import history_view, revision_view
from fleetllm.server.params import ParamError, int_param
from fleetllm.server.ratelimit import LoginLimiter
from fleetllm.server.rollouts import rollout_status
from fleetllm.server.runtime import Runtime, current_runtime, runtime_of

log = get_logger("pages")
bp = Blueprint("pages", __name__, template_folder="templates", static_folder="static",
               static_url_path="/pages/static")
REFRESH_S = 15
MAX_FORM_BYTES = 64 * 1024
LIMITER = "fleetllm.login_limiter"  # app.extensions key of the app's LoginLimiter
DEFAULT_PASSES, MAX_PASSES = 20, 200
PUBLIC = ("pages.static", "pages.openapi")  # served even when the pages are off
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


@bp.record_once
def set_up(state: BlueprintSetupState) -> None:
    """Signed sessions from the configured tokens (none: the pages are off), and the templates' style."""
    app = cast(Flask, state.app)
    auth.configure(app, runtime_of(app).config)
    app.extensions[LIMITER] = LoginLimiter()  # per app: tests run many apps in one process
    app.jinja_env.trim_blocks = app.jinja_env.lstrip_blocks = True


def enabled() -> bool:
    config = current_runtime().config
    return bool(config.admin_tokens or config.operator_tokens or config.viewer_tokens or config.oidc)


@bp.before_request
def pages_enabled() -> Response | None:
    if enabled() or request.endpoint in PUBLIC:
        return None
    return error(404, "the status pages are off: configure viewer_tokens, operator_tokens or admin_tokens, or "
                      "single sign-on (auth.oidc)")


@bp.before_request
def limit_forms() -> None:
    request.max_content_length = MAX_FORM_BYTES  # before any form (login, logout, approve, a refusal) is read


@bp.errorhandler(FilterError)
def bad_filter(exc: FilterError) -> Response:
    return error(400, str(exc))


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
    """The logged-in role (the session cookie, alive in the state store), or None."""
    rt = current_runtime()
    caller = auth.session_caller(current_app, rt.config, rt.clock(), rt.store)
    return caller.role if caller is not None else None


def page(name: str, template: str, view: Any, inputs: Inputs, role: Role, **extra: Any) -> str:
    return render_template(template, view=view, attention=attention_view(inputs), role=str(role), **extra,
                           can_approve=role is Role.ADMIN, can_operate=covers(role, Role.OPERATOR),
                           person=auth.signed_in(), csrf=auth.csrf_token(), active=name, pages=PAGES,
                           fragment=request.args.get("fragment") == "1", refresh_s=REFRESH_S,
                           looks=VERDICT_LOOK, not_judged=NOT_JUDGED_LOOK, messages=get_flashed_messages(True),
                           now=inputs.now, branch=inputs.settings.branch, boxes_route=inputs.settings.boxes_route,
                           approve_target=str(inputs.settings.approve_target), api=API[name])


def html_view(name: str, template: str, make: Callable[[Inputs], Any], extra: dict[str, Any] | None = None,
              **gather_args: Any) -> str:
    """A page: its view over what is read once for this request, rendered for the logged-in role."""
    inputs = gather(current_runtime(), **gather_args)
    return page(name, template, make(inputs), inputs, current_role(), **(extra or {}))


def api_view(make: Callable[[Inputs], Any], **gather_args: Any) -> Response:
    """A page's view as JSON."""
    return as_json(make(gather(current_runtime(), **gather_args)))


def filtered_fleet(inputs: Inputs) -> FleetView:
    return fleet_view(inputs, FleetFilter.parse(request.args))


@bp.get("/")
@requires(Role.VIEWER)
def fleet_page() -> str:
    return html_view("fleet", "fleet.html", filtered_fleet, boxes=True)


@bp.get("/models")
@requires(Role.VIEWER)
def models_page() -> str:
    return html_view("models", "models.html", models_view)


@bp.get("/revision")
@requires(Role.VIEWER)
def revision_page() -> str:
    return html_view("revision", "revision.html", revision_view,
                     extra={"rollout": rollout_status(current_runtime())})  # the staged rollout (issue 14)


@bp.get("/history")
@requires(Role.VIEWER)
def history_page() -> str:
    return html_view("history", "history.html", history_view, passes=DEFAULT_PASSES)


@bp.get("/api/fleet")
@requires(Role.VIEWER)
def api_fleet() -> Response:
    return api_view(filtered_fleet, boxes=True)


@bp.get("/api/models")
@requires(Role.VIEWER)
def api_models() -> Response:
    return api_view(models_view)


@bp.get("/api/attention")
@requires(Role.VIEWER)
def api_attention() -> Response:
    return api_view(attention_view)


@bp.get("/api/revision")
@requires(Role.VIEWER)
def api_revision() -> Response:
    return api_view(revision_view)


@bp.get("/api/passes")
@requires(Role.VIEWER)
def api_passes() -> Response:
    try:
        limit = int_param(request.args, "limit", DEFAULT_PASSES, 1, MAX_PASSES) or DEFAULT_PASSES
    except ParamError as exc:
        return error(400, str(exc))
    return as_json(history_view(gather(current_runtime(), passes=limit)))


@bp.get("/api/openapi.yaml")
def openapi() -> Response:
    return Response(served_document(), mimetype="application/yaml")  # schemas/openapi.yaml, self-contained


def login_page(target: str, problem: str | None = None, status: int = 200) -> tuple[str, int]:
    config = current_runtime().config
    return render_template("login.html", csrf=auth.csrf_token(), next=target, hours=auth.SESSION_HOURS,
                           problem=problem, sso=config.oidc is not None,
                           tokens=bool(config.admin_tokens or config.operator_tokens or config.viewer_tokens)), status


@bp.route("/login", methods=["GET", "POST"])
def login() -> BaseResponse | tuple[str, int]:
    rt = current_runtime()
    target = auth.safe_next(request.values.get("next"))
    if request.method == "GET":
        return redirect(target) if role_or_none() is not None else login_page(target)
    if not auth.csrf_ok(request.form.get("csrf")):
        return login_page(target, "The form expired: enter the token again.", 400)
    client = login_client(rt)
    limiter: LoginLimiter = current_app.extensions[LIMITER]
    verdict = limiter.allow(peer_key(client), time.monotonic())
    if not verdict.allowed:
        rt.metrics.login_refused.labels("rate_limited").inc()
        if verdict.first_refusal:  # then counted in fleetllm_login_refused_total only, until allowed again
            log_event(log, "page login refused", logging.WARNING, reason="rate limited", scope=verdict.scope,
                      peer=client, retry_after_s=verdict.retry_after_s)
        page_text, status = login_page(target, f"Too many login attempts: wait {verdict.retry_after_s} s and try "
                                               "again.", 429)
        response = current_app.make_response((page_text, status))
        response.headers["Retry-After"] = str(verdict.retry_after_s)
        return response
    token = request.form.get("token", "").strip()
    caller = token_caller(rt.config, token or None)
    if caller is None:
        rt.metrics.login_refused.labels("wrong_token").inc()
        log_event(log, "page login refused", logging.WARNING, reason="not a viewer, operator or admin token",
                  peer=client)
        return login_page(target, "That is not a viewer, operator or admin token of this control plane.", 403)
    auth.log_in_token(current_app, caller, token, rt.clock(), rt.store)
    log_event(log, "page login", role=str(caller.role), actor=caller.actor, via="token", peer=client)
    return redirect(target)


def login_client(rt: Runtime) -> str:
    """The address a login comes from: the peer, or behind a trusted proxy its X-Forwarded-For client."""
    peer = request.remote_addr or ""
    proxies = rt.config.trusted_proxies
    if not proxies or not is_exempt(peer, proxies):
        return peer  # X-Forwarded-For is believed from a trusted proxy only
    return resolve_host(None, request.headers.get("X-Forwarded-For"), peer, proxies).name[:64]


@bp.post("/logout")
def logout() -> BaseResponse:
    """End the session here (on every replica); after a single sign-on, also at the provider when it
    advertises an end_session_endpoint (RP-initiated logout), which sends the browser back to /login."""
    rt = current_runtime()
    if not auth.csrf_ok(request.form.get("csrf")):
        return redirect(url_for("pages.login"))
    who = auth.signed_in()
    kind = auth.log_out(rt.store)
    log_event(log, "page logout", actor=who.actor if who else None, peer=request.remote_addr)
    if kind == auth.SSO and rt.oidc is not None:
        provider_logout = rt.oidc.logout_url(f"{rt.oidc.config.redirect_base}{url_for('pages.login')}")
        if provider_logout is not None:  # a page that moves on: CSP's form-action forbids a form's redirect off-site
            return current_app.make_response(render_template("signed_out.html", provider_logout=provider_logout))
    return redirect(url_for("pages.login"))


@bp.post("/approve")
@requires(Role.ADMIN, action="Approving a box")
def approve() -> BaseResponse:
    back = auth.safe_next(request.form.get("next"))
    if not auth.csrf_ok(request.form.get("csrf")):
        flash("The form expired or came from another site: nothing was approved. Try again.", "error")
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
        done = approve_and_record(current_runtime(), host, models, auth.actor(),
                                  Provider(provider) if provider else None)
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
        response.headers["Cache-Control"] = NO_STORE
    return response
