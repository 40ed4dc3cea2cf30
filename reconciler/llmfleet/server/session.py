"""Who is looking: a viewer or admin token, entered once on the login form and kept in a signed
session cookie (Secure, HttpOnly, SameSite=Strict), or sent as `Authorization: Bearer` by scripts.

The cookie never holds a token: it holds the role, a keyed digest of the token (checked against the
configured tokens on every request, so a removed token stops working at once), the login time
(sessions end SESSION_HOURS after login) and a random CSRF token for the forms.

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

from llmfleet.core.secret import Secret
from llmfleet.server.auth import Role, matches_any, token_fingerprint
from llmfleet.settings import ControlPlaneConfig

SESSION_HOURS = 12
COOKIE = "llmfleet_session"
SESSION_ROLES = (Role.VIEWER, Role.ADMIN)  # what a login can grant (never Role.FLEET)


def configure(app: Flask, config: ControlPlaneConfig) -> bool:
    """Set up signed sessions; False when no admin or viewer token is configured (pages are off)."""
    tokens = sorted(t.reveal() for t in (*config.admin_tokens, *config.viewer_tokens))
    if not tokens:
        return False
    app.secret_key = hmac.new("\n".join(tokens).encode(), b"llmfleet.pages.session.v1", hashlib.sha256).hexdigest()
    app.config.update(SESSION_COOKIE_NAME=COOKIE, SESSION_COOKIE_SECURE=True, SESSION_COOKIE_HTTPONLY=True,
                      SESSION_COOKIE_SAMESITE="Strict", SESSION_REFRESH_EACH_REQUEST=False,
                      PERMANENT_SESSION_LIFETIME=timedelta(hours=SESSION_HOURS))
    return True


def _proof(app: Flask, token: str) -> str:
    key = str(app.secret_key).encode()
    return hmac.new(key, b"llmfleet.pages.token\n" + token.encode("utf-8", "surrogateescape"),
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


def log_in(app: Flask, role: Role, token: str, now: float) -> None:
    session.clear()  # a fresh session (and CSRF token) at every login
    session.permanent = True
    session.update(role=str(role), tok=_proof(app, token), fp=token_fingerprint(token), at=now,
                   csrf=secrets.token_urlsafe(32))


def log_out() -> None:
    session.clear()


def session_role(app: Flask, config: ControlPlaneConfig, now: float) -> Role | None:
    role, proof, at = session.get("role"), session.get("tok"), session.get("at")
    if role not in SESSION_ROLES or not isinstance(proof, str) or not isinstance(at, (int, float)):
        return None
    if not 0 <= now - at <= SESSION_HOURS * 3600:
        return None
    found = False
    for token in _tokens(config, Role(role)):  # every token, so timing does not tell which matched
        found = hmac.compare_digest(_proof(app, token.reveal()), proof) | found
    return Role(role) if found else None


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
