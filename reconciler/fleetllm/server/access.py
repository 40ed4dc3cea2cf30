"""Who may call what: one decorator, `requires(role)`, guards every view that needs a credential.

    role          credential                                   views
    Role.FLEET    the fleet key, Authorization: Bearer         the box contract: /vllm/config, /report, /installer
    Role.VIEWER   a viewer or admin token                      the status pages, their /api/*, GET /admin/*
    Role.ADMIN    an admin token                               POST /admin/approve, POST /approve

Where a viewer or admin token may come from depends on the surface (`surface()`), as it always has:

    admin API (/admin/*)    Authorization: Bearer only: a JSON action is never taken on a cookie's say-so
    pages API (/api/*)      Authorization: Bearer, else the login session cookie
    status pages (HTML)     the login session cookie (fleetllm.server.session)

A refusal raises `Refused`: 401 nothing (usable) presented, 403 a wrong or too weak credential, 404 no
such token is configured, 503 no fleet key is configured. How it is answered (JSON, a redirect to
/login, a recorded box answer) is decided per surface in fleetllm.server.errors and the box blueprint.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from enum import StrEnum
from typing import ParamSpec, TypeVar, cast

from flask import current_app, g, request
from werkzeug.exceptions import HTTPException, MethodNotAllowed

from fleetllm.errors import RequestError
from fleetllm.server.accesslog import ROLE_KEY
from fleetllm.server.auth import Role, bearer_token, matches
from fleetllm.server.runtime import current_runtime
from fleetllm.server.session import role_of_token, session_role
from fleetllm.settings import ControlPlaneConfig

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
    """Run the view only for a caller holding `role` (an admin holds viewer too); else raise Refused.
    `action` names what was refused on a page ("Approving a box needs an admin token")."""

    def decorate(view: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(view)
        def guarded(*args: P.args, **kwargs: P.kwargs) -> R:
            g.fleetllm_role = check(role, action)
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


def check(role: Role, action: str = "This") -> Role:
    """The role the caller holds, if it covers `role`; else raises Refused."""
    rt = current_runtime()
    if role is Role.FLEET:
        return _fleet_key(rt.config)
    where = surface()
    allowed = rt.config.admin_tokens if role is Role.ADMIN else (*rt.config.admin_tokens, *rt.config.viewer_tokens)
    if not allowed:
        raise Refused(404, _refusal(role, where, action, configured=False), role)
    token = bearer_token(request.headers.get("Authorization")) if where is not Surface.PAGE else None
    if token is not None:
        held = role_of_token(rt.config, token)
    elif request.blueprint in SESSION_BLUEPRINTS:
        held = session_role(current_app, rt.config, rt.clock(), rt.store)
    else:
        held = None
    if held is Role.ADMIN or (held is not None and held is role):
        return held
    raise Refused(403 if token is not None or held is not None else 401, _refusal(role, where, action), role)


def _fleet_key(config: ControlPlaneConfig) -> Role:
    """The box contract: 503 when no fleet key is configured, 403 when it is missing or wrong."""
    key = config.secrets.fleet_key
    if key is None:
        raise Refused(503, "this control plane has no fleet key configured (secrets.fleet_key)", Role.FLEET)
    token = bearer_token(request.headers.get("Authorization"))
    if token is None:
        raise Refused(403, "missing fleet key: send Authorization: Bearer <fleet key>", Role.FLEET)
    if not matches(token, key):
        raise Refused(403, "wrong fleet key", Role.FLEET)
    return Role.FLEET


def _refusal(role: Role, where: Surface, action: str, *, configured: bool = True) -> str:
    if where is Surface.PAGE:
        return f"{action} needs an admin token: log in with one." if role is Role.ADMIN else \
            "This page needs a viewer or admin token: log in with one."
    if not configured:
        return "no admin_tokens configured" if role is Role.ADMIN else "no viewer or admin tokens configured"
    needed = "an admin token" if role is Role.ADMIN else "a viewer or admin token"
    login = ", or log in at /login" if request.blueprint in SESSION_BLUEPRINTS else ""
    return f"{needed} is required: send Authorization: Bearer <token>{login}"
