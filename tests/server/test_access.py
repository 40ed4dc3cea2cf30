"""One gate (`requires(role)`) on every guarded view, and refusals that answer the same way on each
surface: the box contract's exact answers on /vllm/*, JSON {"error"} with WWW-Authenticate on the
APIs' 401s, and no view without a gate unless it is public on purpose."""

from __future__ import annotations

import dataclasses

from flask import Flask
from flask.testing import FlaskClient

from fleetllm.server.access import required_role
from fleetllm.server.app import create_app
from fleetllm.server.auth import Role
from fleetllm.server.runtime import Runtime
from tests.server.conftest import ADMIN_TOKEN, SECRETS, VIEWER_TOKEN, LogCapture, box_headers

PUBLIC = {"health.health", "health.live", "health.metrics", "admin.push_hook", "pages.login", "pages.logout",
          "pages.openapi", "pages.static", "pages.sso_login", "pages.sso_callback"}
# the webhook is signed; login and logout carry their own CSRF check; single sign-on its state and nonce;
# /metrics its own bearer, metrics_token (fleetllm.core.secret.metrics_refusal), not a role
EXPECTED_ROLES = {
    "box.vllm_config": Role.FLEET, "box.vllm_report": Role.FLEET, "box.vllm_installer": Role.FLEET,
    "box.vllm_gateway_native": Role.FLEET,
    "admin.attention": Role.VIEWER, "admin.reports": Role.VIEWER, "admin.fetches": Role.VIEWER,
    "admin.approvals": Role.VIEWER, "admin.approve_box": Role.ADMIN, "pages.approve": Role.ADMIN,
    "control.get_control": Role.VIEWER, **{f"control.post_{a}": Role.OPERATOR for a in
                                           ("sync", "suspend", "resume", "pin", "unpin")},
    **{f"pages.page_{a}": Role.OPERATOR for a in ("sync", "suspend", "resume", "pin", "unpin", "rollout")},
    "rollout.rollout": Role.VIEWER, "rollout.control": Role.OPERATOR, "rollout.forget": Role.OPERATOR,
}


def test_every_view_is_guarded_or_public_on_purpose(app: Flask) -> None:
    roles = {rule.endpoint: required_role(app.view_functions[rule.endpoint]) for rule in app.url_map.iter_rules()}
    assert {endpoint for endpoint, role in roles.items() if role is None} == PUBLIC
    for endpoint, role in roles.items():
        if endpoint not in PUBLIC:
            assert role is EXPECTED_ROLES.get(endpoint, Role.VIEWER), endpoint


def test_the_box_contract_refusals_are_unchanged_and_recorded(client: FlaskClient, runtime: Runtime) -> None:
    for headers, body in ((box_headers(key=None), "missing fleet key: send Authorization: Bearer <fleet key>"),
                          (box_headers(key="nope"), "wrong fleet key")):
        for method, path in (("GET", "/vllm/config"), ("POST", "/vllm/report"), ("GET", "/vllm/installer")):
            response = client.open(path, method=method, headers=headers)
            assert (response.status_code, response.get_json()) == (403, {"error": body}), path
            assert response.headers["Cache-Control"] == "no-store"
            assert "WWW-Authenticate" not in response.headers  # a box is never asked to authenticate otherwise
    recorded = runtime.store.recent_fetches(box=None, limit=100)
    assert len(recorded) == 6 and {r.status for r in recorded} == {403} and {r.box for r in recorded} == {None}


def test_no_fleet_key_configured_is_a_recorded_503(runtime: Runtime) -> None:
    config = runtime.config
    unkeyed = dataclasses.replace(runtime, config=dataclasses.replace(
        config, secrets=dataclasses.replace(config.secrets, fleet_key=None)))
    response = create_app(unkeyed).test_client().get("/vllm/config", headers=box_headers())
    assert response.status_code == 503
    assert response.get_json() == {"error": "this control plane has no fleet key configured (secrets.fleet_key)"}
    assert runtime.store.recent_fetches(box=None, limit=10)[0].status == 503


def test_api_refusals_share_one_shape(client: FlaskClient) -> None:
    viewer = {"Authorization": f"Bearer {VIEWER_TOKEN}"}
    for method, path in (("GET", "/admin/attention"), ("GET", "/admin/fetches"), ("POST", "/admin/approve"),
                         ("GET", "/api/fleet"), ("GET", "/api/passes")):
        none = client.open(path, method=method)
        assert none.status_code == 401, path
        assert none.headers["WWW-Authenticate"] == 'Bearer realm="fleetllm"'  # RFC 9110: a 401 names the scheme
        wrong = client.open(path, method=method, headers={"Authorization": "Bearer not-a-token"})
        assert wrong.status_code == 403, path
        assert "WWW-Authenticate" not in wrong.headers
        for refused in (none, wrong):
            assert list(refused.get_json()) == ["error"] and "token is required" in refused.get_json()["error"]
            assert not any(secret in refused.get_data(as_text=True) for secret in SECRETS)
    weak = client.post("/admin/approve", json={}, headers=viewer)
    assert (weak.status_code, weak.get_json()) == (403, {"error": "an admin token is required: send "
                                                                  "Authorization: Bearer <token>"})
    assert client.get("/admin/attention", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}).status_code == 200


def test_the_admin_api_takes_no_session_cookie(client: FlaskClient) -> None:
    from tests.pages.conftest import login

    assert login(client, ADMIN_TOKEN).status_code == 302
    assert client.get("/api/attention").status_code == 200  # the pages' API takes the session
    assert client.get("/admin/attention").status_code == 401  # the admin API only a bearer


def test_errors_are_json_on_apis_with_the_headers_http_requires(client: FlaskClient, logs: LogCapture) -> None:
    missing = client.get("/nope")
    assert missing.status_code == 404 and list(missing.get_json()) == ["error"]
    wrong_method = client.post("/vllm/config", headers=box_headers())
    assert wrong_method.status_code == 405 and list(wrong_method.get_json()) == ["error"]
    assert set(wrong_method.headers["Allow"].split(", ")) >= {"GET", "HEAD"}  # RFC 9110 15.5.6
    assert "POST" in client.put("/admin/approve").headers["Allow"].split(", ")
