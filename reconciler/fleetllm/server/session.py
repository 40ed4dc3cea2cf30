"""Who is looking: a viewer or admin token, entered once on the login form and kept in a signed
session cookie (Secure, HttpOnly, SameSite=Strict), or sent as `Authorization: Bearer` by scripts.

The cookie never holds a token: it holds the role, a keyed digest of the token (checked against the
configured tokens on every request, so a removed token stops working at once), the login time
(sessions end SESSION_HOURS after login), a random CSRF token for the forms, and a random session id.
The state store keeps the id's SHA-256 digest until logout or expiry (reconciler/fleetllm/adapters/state/store.py,
SessionStore): a cookie whose session is gone from the store is refused, so POST /logout ends the
session on every replica sharing the store, and a copy of the cookie stops working with it.

The signing key is derived, not configured: HMAC-SHA256 keyed with every configured admin and viewer
token. Sessions therefore survive a restart and hold across replicas with the same config, and
changing any token signs everybody out. Someone who knows every token can forge a session, which
grants nothing they could not get by logging in.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from datetime import timedelta
from urllib.parse import urlsplit

from flask import Flask, request, session

from fleetllm.adapters.state.store import SessionStore
from fleetllm.core.secret import Secret
from fleetllm.server.auth import Role, matches_any, token_fingerprint
from fleetllm.settings import ControlPlaneConfig

SESSION_HOURS = 12
COOKIE = "fleetllm_session"
SESSION_ROLES = (Role.VIEWER, Role.ADMIN)  # what a login can grant (never Role.FLEET)


def configure(app: Flask, config: ControlPlaneConfig) -> bool:
    """Set up signed sessions; False when no admin or viewer token is configured (pages are off)."""
    tokens = sorted(t.reveal() for t in (*config.admin_tokens, *config.viewer_tokens))
    if not tokens:
        return False
    app.secret_key = hmac.new("\n".join(tokens).encode(), b"fleetllm.pages.session.v1", hashlib.sha256).hexdigest()
    app.config.update(SESSION_COOKIE_NAME=COOKIE, SESSION_COOKIE_SECURE=True, SESSION_COOKIE_HTTPONLY=True,
                      SESSION_COOKIE_SAMESITE="Strict", SESSION_REFRESH_EACH_REQUEST=False,
                      PERMANENT_SESSION_LIFETIME=timedelta(hours=SESSION_HOURS))
    return True


def _proof(app: Flask, token: str) -> str:
    key = str(app.secret_key).encode()
    return hmac.new(key, b"fleetllm.pages.token\n" + token.encode("utf-8", "surrogateescape"),
                    hashlib.sha256).hexdigest()[:32]


def _tokens(config: ControlPlaneConfig, role: Role) -> tuple[Secret, ...]:
    return config.admin_tokens if role is Role.ADMIN else config.viewer_tokens


def role_of_token(config: ControlPlaneConfig, token: str | None) -> Role | None:
    if token is None:
        return None
    if matches_any(token, config.admin_tokens):
        return Role.ADMIN
    if matches_any(token, config.viewer_tokens):
        return Role.VIEWER
    return None


def _sid_digest(sid: str) -> str:
    return hashlib.sha256(b"fleetllm.pages.sid\n" + sid.encode("utf-8", "surrogateescape")).hexdigest()


def log_in(app: Flask, role: Role, token: str, now: float, store: SessionStore) -> None:
    session.clear()  # a fresh session (and CSRF token) at every login
    session.permanent = True
    sid = secrets.token_urlsafe(32)
    fingerprint = token_fingerprint(token)
    store.create_session(_sid_digest(sid), str(role), fingerprint, now, now + SESSION_HOURS * 3600)
    session.update(role=str(role), tok=_proof(app, token), fp=fingerprint, at=now, sid=sid,
                   csrf=secrets.token_urlsafe(32))


def log_out(store: SessionStore) -> None:
    """End the session server-side (every copy of the cookie stops working), then clear the cookie."""
    sid = session.get("sid")
    if isinstance(sid, str):
        store.end_session(_sid_digest(sid))
    session.clear()


def session_role(app: Flask, config: ControlPlaneConfig, now: float, store: SessionStore) -> Role | None:
    role, proof, at, sid = session.get("role"), session.get("tok"), session.get("at"), session.get("sid")
    if (role not in SESSION_ROLES or not isinstance(proof, str) or not isinstance(at, (int, float))
            or not isinstance(sid, str)):
        return None
    if not 0 <= now - at <= SESSION_HOURS * 3600:
        return None
    found = False
    for token in _tokens(config, Role(role)):  # every token, so timing does not tell which matched
        found = hmac.compare_digest(_proof(app, token.reveal()), proof) | found
    if not found or store.session_alive(_sid_digest(sid), now) != role:
        return None
    return Role(role)


def actor() -> str:
    """Who acted, for the audit trail: the token's fingerprint, as POST /admin/approve records it."""
    return f"admin:{session.get('fp', '?')}"


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
