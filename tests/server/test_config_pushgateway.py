"""reconcile.pushgateway and reconcile.metrics_file in the control-plane config (issue 18, alerts): what the
builder accepts and refuses, and that no message shows the credential a Pushgateway URL may carry."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetllm.errors import ConfigurationError
from fleetllm.job.configfile import load_config as reconcile_config
from fleetllm.settings import RECONCILE_ONLY, ControlPlaneConfig, load_config

BASE = """repo: {path: fleet}
secrets: {vllm_api_salt: "${env:SALT}"}
state: {url: "sqlite:///state.sqlite3"}
litellm: {url: "http://127.0.0.1:4000", master_key: "${env:MK}"}
"""
ENV = {"SALT": "salt-0123456789abcdef", "MK": "sk-master-0123"}
PASSWORD = "pg-push-s3cret-Yw2"


def config(tmp_path: Path, reconcile: str, env: dict[str, str] | None = None,
           unread: tuple[str, ...] = ()) -> ControlPlaneConfig:
    path = tmp_path / "cp.yaml"
    path.write_text(BASE + reconcile)
    return load_config(path, {**ENV, **(env or {})}, unread=unread)


def refused(tmp_path: Path, reconcile: str, env: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigurationError) as caught:
        config(tmp_path, reconcile, env)
    return str(caught.value)


def test_a_plain_in_cluster_url_and_a_metrics_file(tmp_path: Path) -> None:
    path = tmp_path / "cp.yaml"
    path.write_text(BASE + "reconcile:\n  pushgateway: {url: 'http://pushgateway.monitoring.svc:9091', "
                    "instance: prod-fleet, timeout_s: 3}\n  metrics_file: prom/fleetllm-reconcile.prom\n")
    view = reconcile_config(path, ENV)
    assert view.pushgateway is not None
    assert (view.pushgateway.where, view.pushgateway.instance, view.pushgateway.timeout_s) == (
        "http://pushgateway.monitoring.svc:9091", "prod-fleet", 3.0)
    assert view.pushgateway.username is None
    assert view.metrics_file == tmp_path / "prom" / "fleetllm-reconcile.prom"  # relative: beside the file


def test_none_configured_hands_nothing_over(tmp_path: Path) -> None:
    path = tmp_path / "cp.yaml"
    path.write_text(BASE)
    view = reconcile_config(path, ENV)
    assert (view.pushgateway, view.metrics_file) == (None, None)


def test_a_credential_in_a_plain_url_is_refused_without_showing_it(tmp_path: Path) -> None:
    message = refused(tmp_path, f"reconcile:\n  pushgateway: {{url: 'https://fleetllm:{PASSWORD}@pg.example.com'}}\n")
    assert "carries a credential" in message
    assert "/reconcile/pushgateway/url" in message
    assert PASSWORD not in message


def test_a_url_reference_may_carry_the_credential(tmp_path: Path) -> None:
    loaded = config(tmp_path, "reconcile:\n  pushgateway: {url: '${env:PUSH_URL}'}\n",
                    {"PUSH_URL": f"https://fleetllm:{PASSWORD}@pg.example.com:9091/"})
    target = loaded.reconcile.pushgateway
    assert target is not None
    assert target.where == "https://pg.example.com:9091"
    assert PASSWORD not in repr(loaded)


def test_a_credential_over_plain_http_to_another_host_is_refused(tmp_path: Path) -> None:
    message = refused(tmp_path, "reconcile:\n  pushgateway: {url: 'http://pg.example.com:9091', "
                      "username: '${env:U}', password: '${env:P}'}\n", {"U": "fleetllm", "P": PASSWORD})
    assert "clear text over http to pg.example.com" in message
    assert PASSWORD not in message
    # loopback is fine, and so is https
    config(tmp_path, "reconcile:\n  pushgateway: {url: 'http://127.0.0.1:9091', username: '${env:U}', "
           "password: '${env:P}'}\n", {"U": "fleetllm", "P": PASSWORD})
    config(tmp_path, "reconcile:\n  pushgateway: {url: 'https://pg.example.com', username: '${env:U}', "
           "password: '${env:P}'}\n", {"U": "fleetllm", "P": PASSWORD})


def test_username_needs_a_password(tmp_path: Path) -> None:
    message = refused(tmp_path, "reconcile:\n  pushgateway: {url: 'https://pg.example.com', username: '${env:U}'}\n",
                      {"U": "fleetllm"})
    assert "give both username and password" in message


@pytest.mark.parametrize(("reconcile", "says"), [
    ("reconcile:\n  pushgateway: {url: 'ftp://pg.example.com'}\n", "not a usable pushgateway url"),
    ("reconcile:\n  pushgateway: {url: 'http://x', instance: 'a pod/name'}\n", "/reconcile/pushgateway/instance"),
    ("reconcile:\n  pushgateway: {url: 'http://x', password: 'plain-value'}\n", "not a secret reference"),
    ("reconcile:\n  pushgateway: {instance: prod}\n", "url"),
])
def test_the_schema_refuses_a_bad_section(tmp_path: Path, reconcile: str, says: str) -> None:
    message = refused(tmp_path, reconcile)
    assert says in message
    assert "plain-value" not in message


def test_a_reference_that_holds_no_url_is_refused(tmp_path: Path) -> None:
    message = refused(tmp_path, "reconcile:\n  pushgateway: {url: '${env:PUSH_URL}'}\n", {"PUSH_URL": PASSWORD})
    assert "${env:PUSH_URL} does not hold an http(s) URL" in message
    assert PASSWORD not in message


def test_serve_needs_no_push_credential(tmp_path: Path) -> None:
    """`fleetllm serve` leaves the reconcile job's push secrets unresolved (RECONCILE_ONLY): its unit or
    Deployment is not given them."""
    section = "reconcile:\n  pushgateway: {url: '${cred:pushgateway-url}', username: '${cred:u}', password: '${cred:p}'}\n"
    assert "pushgateway-url" in refused(tmp_path, section)
    loaded = config(tmp_path, section, unread=RECONCILE_ONLY)
    assert loaded.reconcile.pushgateway is None
