"""Single sign-on for the status pages (auth.oidc): OpenID Connect's authorization-code flow with PKCE.

    GET /login/oidc?next=/path   a fresh state, nonce and S256 code verifier (kept in a signed cookie of the
                                 sign-on's own, session.remember_login); redirect to the provider
    GET /oidc/callback           the provider's answer: the state must be this browser's sign-on, the code
                                 is exchanged with the verifier, the ID token verified (signature by the
                                 provider's keys, iss, aud, exp, nonce: fleetllm.adapters.oidc); the role
                                 is the highest auth.oidc.roles gives the person's groups, none: refused

A session then starts as for a token login (fleetllm.server.session), naming the person (subject and
email) in the audit trail, and ending at the earlier of the session's hours and the ID token's expiry.
The callback answers a page that moves on to `next` itself: the provider's redirect is a cross-site
navigation, and a browser holds back the SameSite=Strict session cookie on every step of a redirect
chain that started on another site. Codes, tokens and the client secret are never logged or shown.

Registered on the pages' blueprint (security headers, the pages-off check); importing this module adds
the routes (fleetllm.server.app imports it).
"""

from __future__ import annotations

import logging

from flask import current_app, make_response, redirect, render_template, request
from werkzeug.wrappers.response import Response as BaseResponse

from fleetllm.adapters.oidc import OidcClient, ProviderError, TokenRefused
from fleetllm.logs import get_logger, log_event
from fleetllm.server import session as auth
from fleetllm.server.auth import person_actor, role_for_groups
from fleetllm.server.errors import error
from fleetllm.server.pages.routes import bp, login_client, login_page
from fleetllm.server.runtime import current_runtime

log = get_logger("pages")
MAX_PARAM_CHARS = 4096  # a code or a state longer than this is not one


def _client() -> OidcClient | None:
    return current_runtime().oidc


def _refused(target: str, message: str, status: int, reason: str, **fields: object) -> BaseResponse:
    rt = current_runtime()
    rt.metrics.login_refused.labels("sso_refused").inc()
    log_event(log, "page login refused", logging.WARNING, reason=reason, via="oidc", peer=login_client(rt), **fields)
    page, code = login_page(target, message, status)
    response = make_response(page, code)
    auth.forget_login(response)
    return response


@bp.get("/login/oidc")
def sso_login() -> BaseResponse:
    client = _client()
    if client is None:
        return error(404, "single sign-on is off: configure auth.oidc")
    target = auth.safe_next(request.args.get("next"))
    try:
        login = client.begin()
    except ProviderError as exc:
        log_event(log, "single sign-on unavailable", logging.ERROR, error=str(exc))
        page, code = login_page(target, f"Single sign-on is unavailable: {exc}. Try again later, or log in with a "
                                        "token.", 502)
        return make_response(page, code)
    response = redirect(login.url)
    auth.remember_login(current_app, response, login, target)
    return response


@bp.get("/oidc/callback")
def sso_callback() -> BaseResponse:
    client = _client()
    if client is None:
        return error(404, "single sign-on is off: configure auth.oidc")
    rt = current_runtime()
    pending = auth.pending_login(current_app)
    target = pending[1] if pending is not None else "/"
    said = request.args.get("error")
    if said:
        detail = (request.args.get("error_description") or "")[:200]
        return _refused(target, f"The provider did not sign you in ({said[:80]}{': ' + detail if detail else ''}).",
                        403, "the provider answered an error", error=said[:80])
    if pending is None:
        return _refused("/", "This sign-in expired or was started in another browser: sign in again.", 400,
                        "no sign-in under way in this browser")
    login, target = pending
    state, code = request.args.get("state", ""), request.args.get("code", "")
    if not state or len(state) > MAX_PARAM_CHARS or state != login.state:
        return _refused(target, "This sign-in's state does not match the one this browser started (a forged or "
                                "replayed answer): nothing was signed in. Sign in again.", 400, "state mismatch")
    if not code or len(code) > MAX_PARAM_CHARS:
        return _refused(target, "The provider's answer has no code: sign in again.", 400, "no code")
    try:
        identity = client.finish(code, login)
    except TokenRefused as exc:
        return _refused(target, f"Sign-in refused: {exc}.", 403, str(exc))
    except ProviderError as exc:
        log_event(log, "single sign-on unavailable", logging.ERROR, error=str(exc))
        page, status = login_page(target, f"Single sign-on is unavailable: {exc}. Try again later.", 502)
        return make_response(page, status)
    who = person_actor(identity.subject, identity.email)
    oidc = client.config
    role = role_for_groups(identity.groups, oidc.roles)
    if role is None:
        shown = ", ".join(g[:64] for g in identity.groups[:10]) or "none"
        return _refused(target, f"You signed in as {who}, but none of your groups ({shown}) gives a role in this "
                                "control plane: ask its admins to map one of them (auth.oidc.roles).", 403,
                        "no group maps to a role", actor=who)
    if identity.expires_at <= rt.clock():  # valid within the clock-skew leeway, but no session could last
        return _refused(target, "Your sign-in expired before it reached this control plane (its ID token's exp "
                                "is past): check the clocks of this machine and the provider, then sign in again.",
                        403, "the ID token expired on arrival", actor=who)
    ends = auth.log_in_person(oidc, identity, role, rt.clock(), rt.store)
    log_event(log, "page login", role=str(role), actor=who, via="oidc", peer=login_client(rt),
              session_ends_in_s=int(ends - rt.clock()))
    response = make_response(render_template("signed_in.html", next=target, who=identity.name or who, role=str(role)))
    auth.forget_login(response)
    return response
