"""Who is looking: a person signed in through the single sign-on provider (auth.oidc), or a viewer,
operator or admin token entered once on the login form, kept in a signed session cookie (Secure,
HttpOnly, SameSite=Strict); scripts send `Authorization: Bearer` instead.

The cookie never holds a token, a code or an ID token. For a token login it holds the role, a keyed
digest of the token (checked against the configured tokens on every request, so a removed token stops
working at once) and the name the audit trail gives the token; for a single sign-on it holds the role
the person's groups mapped to at login, their subject, email and name, and the issuer and client it came
through (a session from another provider or client is refused). Both hold the login time (a session
ends SESSION_HOURS after login, or when the ID token expires if that is sooner), a random CSRF token
for the forms and a random session id. The state store keeps the id's SHA-256 digest, the role and the
expiry until logout or expiry (reconciler/fleetllm/adapters/state/store.py, SessionStore): a cookie whose
session is gone from the store is refused, so POST /logout ends the session on every replica sharing
the store, and a copy of the cookie stops working with it.

A person's role is decided at login from the groups in the ID token: a change of groups takes effect at
their next login (logout, or the session's end). An admin who must cut someone off at once removes them
at the provider and ends their sessions by changing the client secret (which signs everybody out).

The signing key is derived, not configured: HMAC-SHA256 keyed with every configured token and the
single sign-on client's secret. Sessions therefore survive a restart and hold across replicas with the
same config, and changing any of them signs everybody out. Someone who knows all of them can forge a
session, which grants nothing they could not get by logging in with the tokens.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

from flask import Flask, g, request, session
from itsdangerous import BadSignature, URLSafeTimedSerializer  # Flask's own cookie signer
from werkzeug.wrappers.response import Response

from fleetllm.adapters.oidc import Identity, LoginRequest, OidcConfig
from fleetllm.adapters.state.store import SessionStore
from fleetllm.server.auth import PEOPLE_ROLES, Caller, Role, all_tokens, person_actor, tokens_of
from fleetllm.settings import ControlPlaneConfig

SESSION_HOURS = 12
COOKIE = "fleetllm_session"
LOGIN_COOKIE = "fleetllm_sso"  # one sign-on under way: its state, nonce and code verifier (signed)
LOGIN_PATH = "/oidc/callback"
LOGIN_MAX_AGE_S = 600  # a sign-on must come back from the provider within this
SESSION_ROLES = tuple(str(r) for r in PEOPLE_ROLES)  # what a login can grant (never Role.FLEET)
TOKEN, SSO = "token", "oidc"  # how a session was started


def configure(app: Flask, config: ControlPlaneConfig) -> bool:
    """Set up signed sessions; False when neither a token nor single sign-on is configured (pages are off)."""
    keys = sorted(t.secret.reveal() for t in all_tokens(config))
    if config.oidc is not None:
        keys.append("oidc\n" + config.oidc.client_secret.reveal())
    if not keys:
        return False
    app.secret_key = hmac.new("\n".join(keys).encode(), b"fleetllm.pages.session.v1", hashlib.sha256).hexdigest()
    app.config.update(SESSION_COOKIE_NAME=COOKIE, SESSION_COOKIE_SECURE=True, SESSION_COOKIE_HTTPONLY=True,
                      SESSION_COOKIE_SAMESITE="Strict", SESSION_REFRESH_EACH_REQUEST=False,
                      PERMANENT_SESSION_LIFETIME=timedelta(hours=SESSION_HOURS))
    return True


def _proof(app: Flask, token: str) -> str:
    key = str(app.secret_key).encode()
    return hmac.new(key, b"fleetllm.pages.token\n" + token.encode("utf-8", "surrogateescape"),
                    hashlib.sha256).hexdigest()[:32]


def _provider(oidc: OidcConfig) -> str:
    """Names the issuer and client a single sign-on came through (kept in the cookie, checked on use)."""
    return hashlib.sha256(f"{oidc.issuer.rstrip('/')}\n{oidc.client_id}".encode()).hexdigest()[:16]


def _sid_digest(sid: str) -> str:
    return hashlib.sha256(b"fleetllm.pages.sid\n" + sid.encode("utf-8", "surrogateescape")).hexdigest()


def _start(store: SessionStore, role: Role, who: str, now: float, expires_at: float, **fields: Any) -> None:
    session.clear()  # a fresh session (and CSRF token) at every login
    session.permanent = True
    sid = secrets.token_urlsafe(32)
    store.create_session(_sid_digest(sid), str(role), who[:200], now, expires_at)
    session.update(role=str(role), who=who, at=now, sid=sid, csrf=secrets.token_urlsafe(32), **fields)


def log_in_token(app: Flask, caller: Caller, token: str, now: float, store: SessionStore) -> None:
    """A session for a token entered on the login form (`caller`: what the token stands for)."""
    _start(store, caller.role, caller.actor, now, now + SESSION_HOURS * 3600, kind=TOKEN, tok=_proof(app, token))


def log_in_person(oidc: OidcConfig, identity: Identity, role: Role, now: float, store: SessionStore) -> float:
    """A session for a person the provider signed in, mapped to `role`; returns when it ends (the earlier
    of SESSION_HOURS and the ID token's expiry)."""
    ends = min(now + SESSION_HOURS * 3600, identity.expires_at)
    _start(store, role, person_actor(identity.subject, identity.email), now, ends, kind=SSO, sub=identity.subject,
           email=identity.email, name=identity.name, exp=ends, via=_provider(oidc))
    return ends


def log_out(store: SessionStore) -> str | None:
    """End the session server-side (every copy of the cookie stops working), then clear the cookie.
    Returns how the session was started (TOKEN or SSO), None when there was none."""
    sid, kind = session.get("sid"), session.get("kind")
    if isinstance(sid, str):
        store.end_session(_sid_digest(sid))
    session.clear()
    return kind if isinstance(sid, str) and kind in (TOKEN, SSO) else None


def session_caller(app: Flask, config: ControlPlaneConfig, now: float, store: SessionStore) -> Caller | None:
    """Who the session cookie stands for, while it is valid, alive in the store and its credential (the
    token, or the provider and client) is still configured; else None."""
    role, who, at, sid = session.get("role"), session.get("who"), session.get("at"), session.get("sid")
    if (role not in SESSION_ROLES or not isinstance(who, str) or not isinstance(at, (int, float))
            or not isinstance(sid, str)):
        return None
    if not 0 <= now - at <= SESSION_HOURS * 3600:
        return None
    kind = session.get("kind")
    if kind == SSO:
        ends = session.get("exp")
        if config.oidc is None or session.get("via") != _provider(config.oidc) or not isinstance(ends, (int, float)) \
                or now >= ends:
            return None
    elif kind == TOKEN:
        proof = session.get("tok")
        if not isinstance(proof, str):
            return None
        found = False
        for token in tokens_of(config, Role(role)):  # every token, so timing does not tell which matched
            found = hmac.compare_digest(_proof(app, token.secret.reveal()), proof) | found
        if not found:
            return None
    else:
        return None  # a cookie from before this version: log in again
    if store.session_alive(_sid_digest(sid), now) != role:
        return None
    return Caller(Role(role), who)


@dataclass(frozen=True)
class Person:
    """Who is signed in, for the pages' header."""

    actor: str
    role: str
    name: str | None
    single_sign_on: bool


def signed_in() -> Person | None:
    role, who = session.get("role"), session.get("who")
    if not isinstance(role, str) or not isinstance(who, str):
        return None
    name = session.get("name")
    return Person(who, role, name if isinstance(name, str) else None, session.get("kind") == SSO)


def actor() -> str:
    """Who acted, for the audit trail: the caller `requires` admitted (fleetllm.server.access)."""
    caller = getattr(g, "fleetllm_caller", None)
    return caller.actor if isinstance(caller, Caller) else "?"


def csrf_token() -> str:
    token = session.get("csrf")
    if not isinstance(token, str):
        token = secrets.token_urlsafe(32)
        session["csrf"] = token
    return token


def csrf_ok(given: str | None) -> bool:
    """The form's token matches the session's, and the browser does not say the request is cross-site."""
    expected = session.get("csrf")
    if not isinstance(expected, str) or not given or not hmac.compare_digest(expected.encode(), given.encode()):
        return False
    if request.headers.get("Sec-Fetch-Site", "same-origin") not in ("same-origin", "none"):
        return False
    origin = request.headers.get("Origin")
    return origin is None or (origin != "null" and urlsplit(origin).netloc == request.host)


def safe_next(target: str | None) -> str:
    """Only a path on this site (no scheme, no host, no `//`): never an open redirect."""
    if (not target or not target.startswith("/") or target.startswith("//") or "\\" in target
            or any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in target)):
        return "/"
    return target


# A sign-on under way. The provider sends the browser back with a top-level cross-site navigation, on
# which a SameSite=Strict cookie is not sent: the login's state, nonce and PKCE code verifier travel in a
# cookie of their own, SameSite=Lax, for /oidc/callback only, signed, and good for LOGIN_MAX_AGE_S.
def _signer(app: Flask) -> URLSafeTimedSerializer:
    return URLSafeTimedSerializer(str(app.secret_key), salt="fleetllm.pages.sso.login")


def remember_login(app: Flask, response: Response, login: LoginRequest, target: str) -> None:
    value = _signer(app).dumps({"state": login.state, "nonce": login.nonce, "verifier": login.code_verifier,
                                "next": target})
    response.set_cookie(LOGIN_COOKIE, value, max_age=LOGIN_MAX_AGE_S, path=LOGIN_PATH, secure=True, httponly=True,
                        samesite="Lax")


def pending_login(app: Flask) -> tuple[LoginRequest, str] | None:
    """The sign-on this browser started here (its LoginRequest without the URL, and where to go after), or
    None: no cookie, expired, or not signed by this control plane."""
    raw = request.cookies.get(LOGIN_COOKIE)
    if not raw:
        return None
    try:
        data = _signer(app).loads(raw, max_age=LOGIN_MAX_AGE_S)
    except BadSignature:  # SignatureExpired is one
        return None
    if not isinstance(data, dict) or not all(isinstance(data.get(k), str) for k in ("state", "nonce", "verifier")):
        return None
    return LoginRequest("", data["state"], data["nonce"], data["verifier"]), safe_next(data.get("next"))


def forget_login(response: Response) -> None:
    response.delete_cookie(LOGIN_COOKIE, path=LOGIN_PATH, secure=True, httponly=True, samesite="Lax")
