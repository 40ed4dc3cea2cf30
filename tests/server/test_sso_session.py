"""A single sign-on session (fleetllm.server.session) through the real app and state store, without a
provider: it names the person, holds no token, ends at the ID token's expiry (or 12 hours, the earlier),
ends at logout on every copy, and is refused once the provider or client it came through is no longer
the configured one. With single sign-on only (no token), the pages are on and the admin API says how
machines get in."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from flask import Flask

from fleetllm.adapters.oidc import Identity
from fleetllm.server import session as auth
from fleetllm.server.app import create_app
from fleetllm.server.auth import Caller, Role
from fleetllm.server.runtime import Runtime
from tests.server.conftest import Clock

OIDC: dict[str, Any] = {"issuer": "https://sso.example.com", "client_id": "fleetllm", "client_secret": "${env:HOOK}",
                        "redirect_base": "https://fleet.example.com", "roles": {"ops": "operator"}}
ALICE = Identity("alice-123", "alice@example.com", "Alice", ("ops",), expires_at=1_800_000_000.0 + 600)


def signed_in(app: Flask, runtime: Runtime, identity: Identity = ALICE) -> dict[str, Any]:
    """Log `identity` in within a request; the session's content, as the cookie would carry it."""
    oidc = runtime.config.oidc
    assert oidc is not None
    with app.test_request_context("/oidc/callback"):
        auth.log_in_person(oidc, identity, Role.OPERATOR, runtime.clock(), runtime.store)
        return dict(auth.session)


def caller(app: Flask, runtime: Runtime, held: dict[str, Any]) -> Caller | None:
    with app.test_request_context("/"):
        auth.session.update(held)
        return auth.session_caller(app, runtime.config, runtime.clock(), runtime.store)


def test_a_sign_on_session_names_the_person_and_ends_with_the_id_token(make_runtime: Callable[..., Runtime]) -> None:
    runtime = make_runtime(auth={"oidc": OIDC})
    app = create_app(runtime)
    held = signed_in(app, runtime)
    assert (held["sub"], held["email"], held["name"], held["role"]) == ("alice-123", "alice@example.com", "Alice",
                                                                         "operator")
    assert held["exp"] == ALICE.expires_at  # sooner than the session's 12 hours
    assert caller(app, runtime, held) == Caller(Role.OPERATOR, "alice-123 <alice@example.com>")
    clock = runtime.clock
    assert isinstance(clock, Clock)
    clock.now = ALICE.expires_at - 1
    assert caller(app, runtime, held) is not None
    clock.now = ALICE.expires_at
    assert caller(app, runtime, held) is None


def test_a_long_lived_id_token_still_ends_at_twelve_hours(make_runtime: Callable[..., Runtime]) -> None:
    runtime = make_runtime(auth={"oidc": OIDC})
    app = create_app(runtime)
    held = signed_in(app, runtime, dataclasses.replace(ALICE, expires_at=runtime.clock() + 7 * 86400))
    assert held["exp"] == runtime.clock() + auth.SESSION_HOURS * 3600


def test_logout_and_a_changed_provider_end_the_session(make_runtime: Callable[..., Runtime]) -> None:
    runtime = make_runtime(auth={"oidc": OIDC})
    app = create_app(runtime)
    held = signed_in(app, runtime)
    for changed in ({**OIDC, "issuer": "https://other-sso.example.com"}, {**OIDC, "client_id": "another-client"}):
        other = make_runtime(auth={"oidc": changed})
        assert caller(app, other, held) is None, changed
    without = dataclasses.replace(runtime, config=dataclasses.replace(runtime.config, oidc=None))
    assert caller(app, without, held) is None  # single sign-on turned off: its sessions with it
    with app.test_request_context("/logout", method="POST"):
        auth.session.update(held)
        assert auth.log_out(runtime.store) == auth.SSO
    assert caller(app, runtime, held) is None  # the copy of the cookie too


def test_with_single_sign_on_only_the_pages_are_on_and_the_api_says_how_machines_get_in(
        make_runtime: Callable[..., Runtime]) -> None:
    runtime = make_runtime(auth={"oidc": OIDC}, admin_tokens=None, operator_tokens=None, viewer_tokens=None)
    client = create_app(runtime).test_client()
    login = client.get("/login")
    assert login.status_code == 200
    page = login.get_data(as_text=True)
    assert 'id="sso"' in page and 'name="token"' not in page  # no token form when there is no token
    assert client.get("/").headers["Location"] == "/login?next=/"
    refused = client.get("/admin/control", headers={"Authorization": "Bearer x"})
    assert refused.status_code == 404
    assert "a single sign-on session does not reach this API" in refused.get_json()["error"]
    assert "auth.oidc.accept_bearer_jwts" in refused.get_json()["error"]
