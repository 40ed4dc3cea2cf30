"""Who may see and do what: the login form, the session cookie, bearer tokens on the API, CSRF on
every form, and the pages switched off without tokens."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from flask.testing import FlaskClient

from fleetllm.server.app import create_app
from fleetllm.server.session import COOKIE, SESSION_HOURS, safe_next
from tests.pages.conftest import LogCapture, World, build_world, csrf_of
from tests.server.conftest import ADMIN_TOKEN, METRICS_TOKEN, VIEWER_TOKEN

METRICS = {"Authorization": f"Bearer {METRICS_TOKEN}"}  # metrics_token of the pages' world


def session_cookie(client: FlaskClient) -> str:
    cookie = client.get_cookie(COOKIE)
    assert cookie is not None
    return cookie.value


@pytest.mark.parametrize("path", ["/", "/models", "/revision", "/history", "/models?fragment=1"])
def test_pages_send_strangers_to_the_login_form(world: World, path: str) -> None:
    response = world.app.test_client().get(path)
    assert response.status_code == 302
    assert response.headers["Location"] == "/login?next=" + quote(path.removesuffix("?fragment=1"), safe="/")
    assert "Needs attention" not in response.get_data(as_text=True)


def test_login_sets_a_strict_session_cookie_without_the_token(world: World, logs: LogCapture) -> None:
    client = world.app.test_client()
    form = client.get("/login")
    assert form.status_code == 200
    response = client.post("/login", data={"token": VIEWER_TOKEN, "csrf": csrf_of(form.get_data(as_text=True)),
                                           "next": "/models"})
    assert response.status_code == 302
    assert response.headers["Location"] == "/models"
    header = next(h for h in response.headers.getlist("Set-Cookie") if h.startswith(f"{COOKIE}="))
    flags = {part.strip().split("=")[0].lower(): part.strip() for part in header.split(";")[1:]}
    assert {"secure", "httponly", "samesite", "path", "expires"} <= set(flags)
    assert flags["samesite"] == "SameSite=Strict"
    value = session_cookie(client)
    assert VIEWER_TOKEN not in value
    data = world.app.session_interface.get_signing_serializer(world.app).loads(value)  # type: ignore[attr-defined]
    assert data["role"] == "viewer"
    assert VIEWER_TOKEN not in json.dumps(data)
    assert client.get("/models").status_code == 200
    assert [e["role"] for e in logs.events("page login")] == ["viewer"]


def test_a_wrong_token_or_a_missing_form_token_is_refused(world: World, logs: LogCapture) -> None:
    client = world.app.test_client()
    csrf = csrf_of(client.get("/login").get_data(as_text=True))
    wrong = client.post("/login", data={"token": "not-a-token-0123456789", "csrf": csrf})
    assert wrong.status_code == 403
    assert "not a viewer, operator or admin token" in wrong.get_data(as_text=True)
    assert client.get("/").status_code == 302
    assert len(logs.events("page login refused")) == 1
    assert "not-a-token-0123456789" not in logs.text
    no_csrf = world.app.test_client().post("/login", data={"token": ADMIN_TOKEN})
    assert no_csrf.status_code == 400
    assert "The form expired" in no_csrf.get_data(as_text=True)


def test_the_api_takes_bearer_tokens_or_the_session(world: World, viewer: FlaskClient) -> None:
    stranger = world.app.test_client()
    assert stranger.get("/api/fleet").status_code == 401
    assert stranger.get("/api/fleet", headers={"Authorization": "Bearer nope-nope-nope"}).status_code == 403
    assert stranger.get("/api/fleet", headers={"Authorization": "Basic dmlld2VyOng="}).status_code == 401
    for token in (VIEWER_TOKEN, ADMIN_TOKEN):
        assert stranger.get("/api/fleet", headers={"Authorization": f"Bearer {token}"}).status_code == 200
    assert viewer.get("/api/attention").status_code == 200
    # a wrong bearer is not rescued by a good session
    assert viewer.get("/api/fleet", headers={"Authorization": "Bearer nope-nope-nope"}).status_code == 403
    assert stranger.get("/api/openapi.yaml").status_code == 200  # the description is public


def test_logout_needs_the_form_token(world: World, viewer: FlaskClient) -> None:
    assert viewer.post("/logout").status_code == 302
    assert viewer.get("/").status_code == 200  # a forged logout (no CSRF token) did nothing
    csrf = csrf_of(viewer.get("/").get_data(as_text=True))
    assert viewer.post("/logout", data={"csrf": csrf}).headers["Location"] == "/login"
    assert viewer.get("/").status_code == 302


def test_sessions_end_after_their_lifetime(world: World, viewer: FlaskClient) -> None:
    world.clock.now += SESSION_HOURS * 3600 - 60
    assert viewer.get("/").status_code == 200
    world.clock.now += 120
    assert viewer.get("/").status_code == 302
    assert viewer.get("/api/fleet").status_code == 401


def test_changing_the_tokens_ends_every_session(world: World, viewer: FlaskClient) -> None:
    value = session_cookie(viewer)
    config = world.runtime.config
    for changed in (dataclasses.replace(config, viewer_tokens=()),
                    dataclasses.replace(config, admin_tokens=())):
        other = create_app(dataclasses.replace(world.runtime, config=changed)).test_client()
        other.set_cookie(COOKIE, value)
        assert other.get("/").status_code == 302


def test_a_session_cannot_claim_another_role(world: World, viewer: FlaskClient) -> None:
    """Even with the signing key, a viewer's token proof does not pass for an admin."""
    serializer = world.app.session_interface.get_signing_serializer(world.app)  # type: ignore[attr-defined]
    data: dict[str, Any] = serializer.loads(session_cookie(viewer))
    viewer.set_cookie(COOKIE, serializer.dumps({**data, "role": "admin"}))
    assert viewer.get("/").status_code == 302
    viewer.set_cookie(COOKIE, session_cookie(viewer)[:-4] + "AAAA")  # a tampered signature
    assert viewer.get("/").status_code == 302


def test_pages_are_off_without_tokens(tmp_path: Path, logs: LogCapture) -> None:
    world = build_world(tmp_path, passes=0, config={"admin_tokens": None, "operator_tokens": None,
                                                    "viewer_tokens": None})
    try:
        client = world.app.test_client()
        for path in ("/", "/login", "/api/fleet", "/api/attention"):
            response = client.get(path)
            assert response.status_code == 404
            assert "configure viewer_tokens, operator_tokens or admin_tokens, or single sign-on (auth.oidc)" in \
                response.get_json()["error"]
        assert client.get("/api/openapi.yaml").status_code == 200
        assert client.get("/health").status_code == 200
    finally:
        world.runtime.stop()


def test_security_headers(viewer: FlaskClient) -> None:
    for path in ("/", "/api/fleet", "/login"):
        headers = viewer.get(path).headers
        assert "default-src 'none'" in headers["Content-Security-Policy"]
        assert "frame-ancestors 'none'" in headers["Content-Security-Policy"]
        assert headers["X-Frame-Options"] == "DENY"
        assert headers["Cache-Control"] == "no-store"
        assert headers["Referrer-Policy"] == "same-origin"


@pytest.mark.parametrize(("target", "expected"), [
    ("/models", "/models"), ("/?fragment=1", "/?fragment=1"), (None, "/"), ("", "/"), ("models", "/"),
    ("//evil.example/", "/"), ("https://evil.example/", "/"), ("/\\evil.example", "/"), ("/\t/evil.example", "/"),
    ("/\n", "/"),
])
def test_only_local_paths_after_login(target: str | None, expected: str) -> None:
    assert safe_next(target) == expected


def test_logout_ends_the_session_for_every_copy_of_the_cookie(world: World, viewer: FlaskClient) -> None:
    """Issue 16, finding 11: before, a copy of the cookie kept working for 12 h after logout."""
    copied = session_cookie(viewer)
    thief = world.app.test_client()
    thief.set_cookie(COOKIE, copied)
    assert thief.get("/").status_code == 200
    csrf = csrf_of(viewer.get("/").get_data(as_text=True))
    assert viewer.post("/logout", data={"csrf": csrf}).status_code == 302
    assert thief.get("/").status_code == 302
    assert thief.get("/api/fleet").status_code == 401
    # another replica sharing the store (a second app over the same runtime) refuses it as well
    other = create_app(world.runtime).test_client()
    other.set_cookie(COOKIE, copied)
    assert other.get("/api/attention").status_code == 401


def test_a_session_unknown_to_the_store_is_refused(world: World, viewer: FlaskClient) -> None:
    """A cookie signed with the right key but naming no stored session (or none at all) is refused."""
    serializer = world.app.session_interface.get_signing_serializer(world.app)  # type: ignore[attr-defined]
    data: dict[str, Any] = serializer.loads(session_cookie(viewer))
    for forged in ({**data, "sid": "made-up"}, {k: v for k, v in data.items() if k != "sid"}):
        viewer.set_cookie(COOKIE, serializer.dumps(forged))
        assert viewer.get("/").status_code == 302


def test_login_is_rate_limited_per_peer_and_logged_without_the_token(world: World, logs: LogCapture) -> None:
    """Issue 16, finding 11: 60 wrong tokens in 0.4 s were all checked. Now 10 a peer, then 429."""
    client = world.app.test_client()
    csrf = csrf_of(client.get("/login").get_data(as_text=True))
    statuses = [client.post("/login", data={"token": f"guess-{i:04d}-0123456789", "csrf": csrf}).status_code
                for i in range(60)]
    assert statuses[:10] == [403] * 10
    assert statuses[10:] == [429] * 50
    limited = client.post("/login", data={"token": VIEWER_TOKEN, "csrf": csrf})  # even the right one, for now
    assert limited.status_code == 429
    assert int(limited.headers["Retry-After"]) >= 1
    other = world.app.test_client()  # another peer is not affected
    other.environ_base["REMOTE_ADDR"] = "192.0.2.50"
    other_csrf = csrf_of(other.get("/login").get_data(as_text=True))
    assert other.post("/login", data={"token": VIEWER_TOKEN, "csrf": other_csrf}).status_code == 302
    refused = logs.events("page login refused")
    assert [e["reason"] for e in refused] == ["not a viewer, operator or admin token"] * 10 + ["rate limited"]
    assert all("guess-" not in json.dumps(e) for e in refused)
    assert VIEWER_TOKEN not in logs.text
    metrics = client.get("/metrics", headers=METRICS).get_data(as_text=True)
    assert 'fleetllm_login_refused_total{reason="rate_limited"} 51.0' in metrics
    assert 'fleetllm_login_refused_total{reason="wrong_token"} 10.0' in metrics


def test_forwarded_for_does_not_dodge_the_login_limit(world: World) -> None:
    """X-Forwarded-For is believed from a trusted proxy only: a client cannot name a new peer each time."""
    client = world.app.test_client()
    csrf = csrf_of(client.get("/login").get_data(as_text=True))
    statuses = [client.post("/login", data={"token": "wrong-token-0123456789", "csrf": csrf},
                            headers={"X-Forwarded-For": f"198.51.100.{i}"}).status_code for i in range(12)]
    assert statuses[-1] == 429


def test_the_global_login_limit() -> None:
    from fleetllm.server.ratelimit import LoginLimiter

    limiter = LoginLimiter(peer_per_minute=10, peer_burst=10, global_per_minute=60, global_burst=30, max_keys=5)
    verdicts = [limiter.allow(f"192.0.2.{i}", 100.0) for i in range(40)]  # 40 peers, one attempt each
    assert sum(v.allowed for v in verdicts) == 30
    assert {v.scope for v in verdicts if not v.allowed} == {"global"}
    assert limiter.tracked <= 5  # peers tracked stay bounded
    assert limiter.allow("192.0.2.99", 101.0).allowed  # one token back per second
    assert not limiter.allow("192.0.2.98", 101.0).allowed
