"""Who may call what: one decorator, `requires(role)`, guards every view that needs a credential.

    role            credential                                 views
    Role.FLEET      the fleet key, Authorization: Bearer       the box contract: /vllm/config, /report, /installer,
                                                               /gateway-native/<tag>
    Role.VIEWER     a viewer, operator or admin                the status pages, their /api/*, GET /admin/*
    Role.OPERATOR   an operator or admin                       sync, suspend, resume, pin, unpin; the rollout's
                                                               pause, resume, abort (API and pages)
    Role.ADMIN      an admin                                   POST /admin/approve, POST /approve

A viewer, operator or admin is a configured token (admin_tokens, operator_tokens, viewer_tokens), a
person signed in through single sign-on (auth.oidc: the role their groups map to), or, with
auth.oidc.accept_bearer_jwts, a JWT of the provider sent as a bearer. Where each may come from depends
on the surface (`surface()`):

    admin API (/admin/*)    Authorization: Bearer only: a JSON action is never taken on a cookie's say-so
    pages API (/api/*)      Authorization: Bearer, else the login session cookie
    status pages (HTML)     the login session cookie (fleetllm.server.session)

`requires` keeps the admitted `Caller` (role, and the actor the audit trail names) for the view:
`current_caller()`. A refusal raises `Refused`: 401 nothing (usable) presented, 403 a wrong, forged or
too weak credential, 404 no credential of the role can exist (none configured), 503 no fleet key is
configured or the provider cannot be reached to verify a JWT. How it is answered (JSON, a redirect to
/login, a recorded box answer) is decided per surface in fleetllm.server.errors and the box blueprint.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from enum import StrEnum
from typing import ParamSpec, TypeVar, cast

from flask import current_app, g, request
from werkzeug.exceptions import HTTPException, MethodNotAllowed

from fleetllm.adapters.oidc import ProviderError, TokenRefused
from fleetllm.core.secret import bearer_token
from fleetllm.errors import RequestError
from fleetllm.logs import get_logger, log_event
from fleetllm.server.accesslog import ROLE_KEY
from fleetllm.server.auth import (
    PEOPLE_ROLES,
    Caller,
    Role,
    covers,
    fleet_key_refusal,
    person_actor,
    role_for_groups,
    token_caller,
    tokens_of,
)
from fleetllm.server.runtime import Runtime, current_runtime
from fleetllm.server.session import session_caller
from fleetllm.settings import ControlPlaneConfig

log = get_logger("access")
P = ParamSpec("P")
R = TypeVar("R")
SESSION_BLUEPRINTS = frozenset({"pages"})  # the blueprints whose views take the login session cookie
PAGES_API_PREFIX = "/api/"
ROLE_ATTRIBUTE = "fleetllm_required_role"  # set on every guarded view (`required_role`)


class Surface(StrEnum):
    """Who a path answers, and so how its refusals and errors look."""

    BOX = "box"  # /vllm/*: the box contract (JSON; every answer is recorded)
    API = "api"  # JSON for scripts and pages.js: /admin/*, /hooks/*, /api/*, /health, /metrics
    PAGE = "page"  # HTML for people: the status pages, /login, /logout, /approve


class Refused(RequestError, HTTPException):  # noqa: N818 (what happened to the request)
    """A guarded view was not run. `code` is the status, `description` the sentence for the caller
    (it says what to send or configure, never what was expected)."""

    def __init__(self, code: int, message: str, role: Role) -> None:
        super().__init__(message)
        self.code = code
        self.role = role


def surface() -> Surface:
    """The surface of the current request, also for requests that matched no route: a 405 on a page's
    path is a page's error, and an unknown path is a page only for a browser (one that prefers HTML)."""
    if request.path.startswith("/vllm/"):
        return Surface.BOX
    blueprint = request.blueprint
    if request.url_rule is None:
        blueprint = _blueprint_of_unrouted()
        if blueprint is None:
            wanted = request.accept_mimetypes.best_match(("application/json", "text/html"), "application/json")
            return Surface.PAGE if wanted == "text/html" else Surface.API
    if blueprint == "pages" and not request.path.startswith(PAGES_API_PREFIX):
        return Surface.PAGE
    return Surface.API


def _blueprint_of_unrouted() -> str | None:
    """The blueprint whose route has this path but not this method (a 405), else None."""
    exc = request.routing_exception
    if not isinstance(exc, MethodNotAllowed) or not exc.valid_methods:
        return None
    adapter = current_app.create_url_adapter(request)
    if adapter is None:
        return None
    try:
        endpoint, _ = adapter.match(method=next(iter(exc.valid_methods)))
    except HTTPException:
        return None
    blueprint, _, _ = str(endpoint).rpartition(".")
    return blueprint or None


def requires(role: Role, *, action: str = "This") -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Run the view only for a caller whose role covers `role` (an admin holds operator and viewer too);
    else raise Refused. `action` names what was refused on a page ("Approving a box needs an admin token")."""

    def decorate(view: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(view)
        def guarded(*args: P.args, **kwargs: P.kwargs) -> R:
            g.fleetllm_caller = check(role, action)
            g.fleetllm_role = g.fleetllm_caller.role
            request.environ[ROLE_KEY] = str(g.fleetllm_role)  # for the access log (fleetllm.server.accesslog)
            return view(*args, **kwargs)

        setattr(guarded, ROLE_ATTRIBUTE, role)
        return guarded

    return decorate


def required_role(view: Callable[..., object]) -> Role | None:
    """The role a view requires, None for a public one (tests check that no view is left unguarded)."""
    role = getattr(view, ROLE_ATTRIBUTE, None)
    return role if isinstance(role, Role) else None


def current_role() -> Role:
    """The role `requires` granted to the current request."""
    return cast(Role, g.fleetllm_role)


def current_caller() -> Caller:
    """Who `requires` admitted for the current request (the role, and how the audit trail names them)."""
    return cast(Caller, g.fleetllm_caller)


def configured(config: ControlPlaneConfig, role: Role, where: Surface) -> bool:
    """Whether a credential covering `role` can exist on this surface: a token of that role or above, or
    single sign-on mapping a group to one (a session on the pages, a bearer JWT where accepted)."""
    if any(tokens_of(config, held) for held in PEOPLE_ROLES if covers(held, role)):
        return True
    oidc = config.oidc
    if oidc is None or not any(covers(Role(r), role) for r in oidc.roles.values()):
        return False
    return oidc.accept_bearer_jwts or request.blueprint in SESSION_BLUEPRINTS


def check(role: Role, action: str = "This") -> Caller:
    """Who the caller is, if their role covers `role`; else raises Refused."""
    rt = current_runtime()
    if role is Role.FLEET:
        return Caller(_fleet_key(rt.config), "fleet")
    where = surface()
    if not configured(rt.config, role, where):
        raise Refused(404, _refusal(role, where, action, configured=False), role)
    token = bearer_token(request.headers.get("Authorization")) if where is not Surface.PAGE else None
    if token is not None:
        caller = token_caller(rt.config, token) or _jwt_caller(rt, token, role)
    elif request.blueprint in SESSION_BLUEPRINTS:
        caller = session_caller(current_app, rt.config, rt.clock(), rt.store)
    else:
        caller = None
    if caller is not None and covers(caller.role, role):
        return caller
    raise Refused(403 if token is not None or caller is not None else 401, _refusal(role, where, action), role)


def _jwt_caller(rt: Runtime, token: str, role: Role) -> Caller | None:
    """A bearer JWT of the single sign-on provider (auth.oidc.accept_bearer_jwts), verified and mapped to a
    role; None when such tokens are not accepted or it is no JWT. A JWT that does not hold is refused
    with what is wrong with it (never the token)."""
    oidc = rt.config.oidc
    if oidc is None or not oidc.accept_bearer_jwts or rt.oidc is None or token.count(".") != 2:
        return None
    try:
        identity = rt.oidc.verify_bearer(token)
    except TokenRefused as exc:
        log_event(log, "bearer jwt refused", logging.WARNING, reason=str(exc), peer=request.remote_addr)
        raise Refused(403, f"{exc}", role) from None
    except ProviderError as exc:
        log_event(log, "bearer jwt unverifiable", logging.ERROR, error=str(exc))
        raise Refused(503, f"cannot verify the bearer token now: {exc}", role) from None
    mapped = role_for_groups(identity.groups, oidc.roles)
    if mapped is None:
        raise Refused(403, f"the bearer token of {person_actor(identity.subject, identity.email)} is valid, but "
                      f"none of its groups ({_groups(identity.groups)}) maps to a role in auth.oidc.roles", role)
    return Caller(mapped, person_actor(identity.subject, identity.email))


def _groups(groups: tuple[str, ...]) -> str:
    shown = ", ".join(g[:64] for g in groups[:10])
    return (shown + (f", +{len(groups) - 10} more" if len(groups) > 10 else "")) if groups else "none"


def _fleet_key(config: ControlPlaneConfig) -> Role:
    """The box contract: 503 when no fleet key is configured, 403 when it is missing or wrong."""
    refusal = fleet_key_refusal(config, request.headers.get("Authorization"))
    if refusal is not None:
        raise Refused(*refusal, Role.FLEET)
    return Role.FLEET


NEEDED = {Role.ADMIN: "an admin", Role.OPERATOR: "an operator or admin", Role.VIEWER: "a viewer, operator or admin"}


def _refusal(role: Role, where: Surface, action: str, *, configured: bool = True) -> str:
    sso = current_runtime().config.oidc is not None
    if where is Surface.PAGE:
        what = f"{action} needs" if role is not Role.VIEWER else "This page needs"
        how = f"sign in with an account of {NEEDED[role]} group, or log in with such a token" if sso else \
            "log in with one"
        return f"{what} {NEEDED[role]} token: {how}." if not sso else f"{what} {NEEDED[role]}: {how}."
    if not configured:
        lists = [name for held, name in (
            (Role.ADMIN, "admin_tokens"), (Role.OPERATOR, "operator_tokens"), (Role.VIEWER, "viewer_tokens"))
            if covers(held, role)]
        oidc = current_runtime().config.oidc
        if oidc is not None and request.blueprint not in SESSION_BLUEPRINTS and not oidc.accept_bearer_jwts:
            return (f"no {' or '.join(lists)} configured: a single sign-on session does not reach this API; "
                    "configure a token, or auth.oidc.accept_bearer_jwts for the provider's JWTs")
        return f"no {' or '.join(lists)} configured" + (" (and no auth.oidc group maps to such a role)" if sso else "")
    login = ", or log in at /login" if request.blueprint in SESSION_BLUEPRINTS else ""
    return f"{NEEDED[role]} token is required: send Authorization: Bearer <token>{login}"
