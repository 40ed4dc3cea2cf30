"""The operator role and who the audit trail names, through the real app: an operator token (named
`deployer` in the config) may run the fleet controls and steer the rollout but not approve; a viewer
may do neither; an admin still does everything; every action names its caller (token:NAME for a named
token, <role>:<fingerprint> for an unnamed one). The role ladder and the group mapping, and the config
of named tokens and of auth.oidc."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from flask.testing import FlaskClient

from fleetllm.core.rollout.model import Rollout, RolloutState
from fleetllm.errors import ConfigurationError
from fleetllm.server.auth import Caller, Role, covers, person_actor, role_for_groups, token_caller, token_fingerprint
from fleetllm.server.runtime import Runtime
from fleetllm.settings import load_config
from tests.server.conftest import (
    ADMIN_TOKEN,
    ENV,
    OPERATOR_NAME,
    OPERATOR_TOKEN,
    VIEWER_TOKEN,
    base_config,
    write_config,
)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_the_role_ladder() -> None:
    assert covers(Role.ADMIN, Role.OPERATOR) and covers(Role.ADMIN, Role.VIEWER) and covers(Role.OPERATOR, Role.VIEWER)
    assert not covers(Role.OPERATOR, Role.ADMIN) and not covers(Role.VIEWER, Role.OPERATOR)
    assert not covers(Role.ADMIN, Role.FLEET) and not covers(Role.FLEET, Role.VIEWER) and covers(Role.FLEET, Role.FLEET)


def test_groups_map_to_the_highest_role_they_give() -> None:
    mapping = {"fleet-viewers": "viewer", "fleet-ops": "operator", "fleet-admins": "admin"}
    assert role_for_groups(["staff", "fleet-viewers"], mapping) is Role.VIEWER
    assert role_for_groups(["fleet-ops", "fleet-viewers"], mapping) is Role.OPERATOR
    assert role_for_groups(["fleet-viewers", "fleet-admins", "fleet-ops"], mapping) is Role.ADMIN
    assert role_for_groups(["staff"], mapping) is None
    assert role_for_groups([], mapping) is None
    assert role_for_groups(["FLEET-OPS"], mapping) is None  # group names are compared exactly


def test_a_token_is_named_by_its_config_or_its_fingerprint(runtime: Runtime) -> None:
    config = runtime.config
    assert token_caller(config, OPERATOR_TOKEN) == Caller(Role.OPERATOR, f"token:{OPERATOR_NAME}")
    assert token_caller(config, ADMIN_TOKEN) == Caller(Role.ADMIN, f"admin:{token_fingerprint(ADMIN_TOKEN)}")
    assert token_caller(config, VIEWER_TOKEN) == Caller(Role.VIEWER, f"viewer:{token_fingerprint(VIEWER_TOKEN)}")
    assert token_caller(config, "not-a-token-of-this-plane") is None
    assert person_actor("alice-123", "alice@example.com") == "alice-123 <alice@example.com>"
    assert person_actor("ci-robot", None) == "ci-robot"


def test_an_operator_runs_the_controls_and_is_named_in_the_audit_trail(client: FlaskClient) -> None:
    suspended = client.post("/admin/suspend", json={"reason": "maintenance"}, headers=bearer(OPERATOR_TOKEN))
    assert suspended.status_code == 200 and suspended.get_json()["status"] == "suspended"
    assert client.post("/admin/resume", headers=bearer(OPERATOR_TOKEN)).status_code == 200
    assert client.post("/admin/sync", headers=bearer(ADMIN_TOKEN)).status_code == 202  # an admin still may
    for path in ("/admin/suspend", "/admin/sync", "/admin/unpin"):
        refused = client.post(path, headers=bearer(VIEWER_TOKEN))
        assert refused.status_code == 403, path
        assert refused.get_json() == {"error": "an operator or admin token is required: send Authorization: "
                                               "Bearer <token>"}
    audit = client.get("/admin/control", headers=bearer(VIEWER_TOKEN)).get_json()["audit"]
    assert [(e["action"], e["actor"]) for e in audit] == [
        ("sync", f"admin:{token_fingerprint(ADMIN_TOKEN)}"), ("resume", f"token:{OPERATOR_NAME}"),
        ("suspend", f"token:{OPERATOR_NAME}")]


def test_an_operator_may_not_approve(client: FlaskClient) -> None:
    refused = client.post("/admin/approve", json={"host": "203.0.113.99", "models": ["m"]},
                          headers=bearer(OPERATOR_TOKEN))
    assert refused.status_code == 403
    assert refused.get_json() == {"error": "an admin token is required: send Authorization: Bearer <token>"}


def test_rollout_requests_are_operators_and_audited(runtime: Runtime, client: FlaskClient) -> None:
    served = runtime.tracker.served
    assert served is not None
    runtime.store.save_rollout(Rollout(served.revision, RolloutState.RUNNING, 1.0, 2.0, waves=1), {})
    assert client.post("/admin/rollout/pause", headers=bearer(VIEWER_TOKEN)).status_code == 403
    paused = client.post("/admin/rollout/pause", headers=bearer(OPERATOR_TOKEN))
    assert paused.status_code == 202 and paused.get_json()["by"] == f"token:{OPERATOR_NAME}"
    assert client.post("/admin/rollout/pause", headers=bearer(OPERATOR_TOKEN)).status_code == 409  # once
    audit = client.get("/admin/control", headers=bearer(VIEWER_TOKEN)).get_json()["audit"]
    assert [(e["action"], e["actor"], e["revision"]) for e in audit] == [
        ("rollout-pause", f"token:{OPERATOR_NAME}", served.revision)]


def test_the_pages_give_an_operator_the_controls_and_the_rollout_buttons(runtime: Runtime,
                                                                        client: FlaskClient) -> None:
    from tests.pages.conftest import csrf_of, login

    served = runtime.tracker.served
    assert served is not None
    runtime.store.save_rollout(Rollout(served.revision, RolloutState.RUNNING, 1.0, 2.0, waves=1), {})
    assert login(client, OPERATOR_TOKEN).status_code == 302
    page = client.get("/revision").get_data(as_text=True)
    assert 'action="/control/rollout/pause"' in page and 'action="/control/suspend"' in page
    assert 'action="/approve"' not in page
    done = client.post("/control/rollout/pause", data={"csrf": csrf_of(page), "next": "/revision"})
    assert done.status_code == 302
    after = client.get("/revision").get_data(as_text=True)
    assert "Pause requested" in after and f"token:{OPERATOR_NAME}" in after
    viewer = client.application.test_client()
    assert login(viewer, VIEWER_TOKEN).status_code == 302
    seen = viewer.get("/revision").get_data(as_text=True)
    assert 'action="/control/rollout/pause"' not in seen and 'action="/control/suspend"' not in seen
    forbidden = viewer.post("/control/rollout/abort", data={"csrf": csrf_of(seen), "next": "/revision"})
    assert (forbidden.status_code, forbidden.headers["Location"]) == (302, "/revision")
    assert "Controlling the rollout needs an operator or admin token: log in with one." in \
        viewer.get("/revision").get_data(as_text=True)
    audit = client.get("/admin/control", headers=bearer(VIEWER_TOKEN)).get_json()["audit"]
    assert [(e["action"], e["actor"]) for e in audit] == [("rollout-pause", f"token:{OPERATOR_NAME}")]


def config_problems(tmp_path: Path, **changes: Any) -> str:
    document = {**base_config(tmp_path, tmp_path / "s.db"), **changes}
    with pytest.raises(ConfigurationError) as caught:
        load_config(write_config(tmp_path / "cp.yaml", document), env={**ENV, "CS": "client-secret-0123456789"})
    return str(caught.value)


OIDC: dict[str, Any] = {"issuer": "https://sso.example.com", "client_id": "fleetllm", "client_secret": "${env:CS}",
                        "redirect_base": "https://fleet.example.com", "roles": {"fleet-ops": "operator"}}


def test_named_tokens_and_single_sign_on_load(tmp_path: Path) -> None:
    document = {**base_config(tmp_path, tmp_path / "s.db"), "auth": {"oidc": {
        **OIDC, "scopes": ["email", "groups"], "groups_claim": "realm_access.roles", "redirect_base":
            "https://fleet.example.com/"}}}
    config = load_config(write_config(tmp_path / "cp.yaml", document), env={**ENV, "CS": "client-secret-0123456789"})
    assert [(t.name, t.secret.reveal()) for t in config.operator_tokens] == [(OPERATOR_NAME, OPERATOR_TOKEN)]
    assert [t.name for t in config.admin_tokens] == [None]  # a plain reference, as before
    oidc = config.oidc
    assert oidc is not None
    assert oidc.scopes == ("openid", "email", "groups") and oidc.groups_claim == ("realm_access", "roles")
    assert oidc.callback_url == "https://fleet.example.com/oidc/callback"
    assert oidc.client_secret.reference == "${env:CS}" and "client-secret" not in repr(oidc)


def test_bad_token_names_and_sign_on_settings_are_refused_saying_what_to_do(tmp_path: Path) -> None:
    twice = config_problems(tmp_path, admin_tokens=[{"name": "ci", "token": "${env:ADMIN}"}],
                            viewer_tokens=[{"name": "ci", "token": "${env:VIEWER}"}])
    assert "two tokens are named 'ci'" in twice
    bad_name = config_problems(tmp_path, admin_tokens=[{"name": "has space", "token": "${env:ADMIN}"}])
    assert "/admin_tokens/0" in bad_name and "{name: NAME, token: REFERENCE}" in bad_name
    plain = config_problems(tmp_path, auth={"oidc": {**OIDC, "issuer": "http://sso.example.com"}})
    assert "/auth/oidc/issuer: issuer must be https" in plain
    with_path = config_problems(tmp_path, auth={"oidc": {**OIDC, "redirect_base": "https://fleet.example.com/ui"}})
    assert "has a path: give scheme://host[:port] only" in with_path
    bad_role = config_problems(tmp_path, auth={"oidc": {**OIDC, "roles": {"ops": "superuser"}}})
    assert "/auth/oidc/roles/ops" in bad_role
    inline_secret = config_problems(tmp_path, auth={"oidc": {**OIDC, "client_secret": "s3cr3t-value"}})
    assert "/auth/oidc/client_secret: not a secret reference" in inline_secret and "s3cr3t-value" not in inline_secret
