"""One settings object (issue 17 point 4): the defaults are the schema's and nobody else's, the
environment-only settings go through the same builder as the file (same checks, same defaults, same
`Secret`s), and a secret is revealed only where it is used or put on the wire."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fleetllm import settings
from fleetllm.core.fleet.schema import load_schema
from fleetllm.core.secret import Secret
from fleetllm.errors import ConfigurationError
from fleetllm.job.configfile import JobConfig, config_from_env
from fleetllm.job.configfile import load_config as reconcile_config
from fleetllm.job.engine import Reconciler
from fleetllm.settings import DEFAULTS, ControlPlaneConfig, Listen, load_config, settings_from_env
from tests.conftest import ROOT

SALT = "salt-0123456789abcdef"
MINIMAL = """repo: {path: fleet}
secrets: {vllm_api_salt: "${env:SALT}"}
state: {url: "sqlite:///state.sqlite3"}
litellm: {url: "http://127.0.0.1:4000", master_key: "${env:MK}"}
"""
ENV = {"SALT": SALT, "MK": "sk-master-0123"}
CI_ENV = {"LITELLM_URL": "http://127.0.0.1:4000", "LITELLM_MASTER_KEY": "sk-master-0123",
          "FLEETLLM_VLLM_API_SALT": SALT}

# Where each default of schemas/control-plane.schema.json lands in the settings.
TAKEN: dict[str, Callable[[ControlPlaneConfig], Any]] = {
    "/repo/branch": lambda c: c.repo.branch,
    "/repo/refresh_interval_s": lambda c: c.repo.refresh_interval_s,
    "/repo/approve/target": lambda c: c.repo.approve_target,
    "/listen": lambda c: c.listen,
    "/state/fetch_log_max_rows": lambda c: c.state.fetch_log_max_rows,
    "/state/fetch_log_max_age_days": lambda c: c.state.fetch_log_max_age_days,
    "/state/reports_per_box": lambda c: c.state.reports_per_box,
    "/attention/max_entries": lambda c: c.attention_max_entries,
    "/server/report_key_required": lambda c: c.report_key_required,
    "/server/threads": lambda c: c.threads,
    "/server/timeout_s": lambda c: c.timeout_s,
    "/server/header_timeout_s": lambda c: c.limits.header_timeout_s,
    "/server/body_timeout_s": lambda c: c.limits.body_timeout_s,
    "/server/max_header_bytes": lambda c: c.limits.max_header_bytes,
    "/server/max_connections": lambda c: c.limits.max_connections,
    "/server/max_connections_per_peer": lambda c: c.limits.max_connections_per_peer,
    "/server/body_buffer_bytes": lambda c: c.limits.body_buffer_bytes,
    "/server/max_connections_per_network": lambda c: c.limits.max_connections_per_network,
    "/server/network_cap_exempt": lambda c: list(c.limits.network_cap_exempt),
    # null: the image's builds when it has them (tests/server/test_gateway_native_api.py), else none
    "/server/gateway_native": lambda c: None if c.gateway_native == settings.default_gateway_native()
    else c.gateway_native,
    "/litellm/timeout_s": lambda c: c.litellm.timeout_s if c.litellm else None,
    "/litellm/write_concurrency": lambda c: c.litellm.write_concurrency if c.litellm else None,
    "/reconcile/enabled": lambda c: c.reconcile.enabled,
    "/reconcile/dry_run": lambda c: c.reconcile.dry_run,
    "/notifications/renotify_interval_s": lambda c: c.notifications.renotify_interval_s,
    "/notifications/send_resolved": lambda c: c.notifications.send_resolved,
    "/notifications/timeout_s": lambda c: c.notifications.timeout_s,
    "/notifications/attempts": lambda c: c.notifications.attempts,
    "/notifications/queue_size": lambda c: c.notifications.queue_size,
    "/notifications/drain_timeout_s": lambda c: c.notifications.drain_timeout_s,
    "/log_level": lambda c: c.log_level,
}
# The defaults inside reconcile.pushgateway, an optional section: taken from a config that has one.
PUSHGATEWAY = 'reconcile: {pushgateway: {url: "http://127.0.0.1:9091"}}\n'
TAKEN_IN_PUSHGATEWAY: dict[str, Callable[[ControlPlaneConfig], Any]] = {
    "/reconcile/pushgateway/instance": lambda c: c.reconcile.pushgateway.instance if c.reconcile.pushgateway else None,
    "/reconcile/pushgateway/timeout_s": lambda c: c.reconcile.pushgateway.timeout_s if c.reconcile.pushgateway
    else None,
}

# The defaults inside auth.oidc, an optional section: taken from a config that has one.
OIDC = ('auth: {oidc: {issuer: "https://sso.example.com", client_id: fleetllm, client_secret: "${env:MK}", '
        'redirect_base: "https://fleet.example.com", roles: {ops: operator}}}\n')
TAKEN_IN_OIDC: dict[str, Callable[[ControlPlaneConfig], Any]] = {
    "/auth/oidc/scopes": lambda c: list(c.oidc.scopes) if c.oidc else None,
    "/auth/oidc/groups_claim": lambda c: ".".join(c.oidc.groups_claim) if c.oidc else None,
    "/auth/oidc/accept_bearer_jwts": lambda c: c.oidc.accept_bearer_jwts if c.oidc else None,
    "/auth/oidc/leeway_s": lambda c: c.oidc.leeway_s if c.oidc else None,
    "/auth/oidc/timeout_s": lambda c: c.oidc.timeout_s if c.oidc else None,
}

# The defaults inside forge, an optional section: taken from a config that has one.
FORGE = 'forge: {repository: fleet-org/fleet, token: "${env:MK}"}\n'
TAKEN_IN_FORGE: dict[str, Callable[[ControlPlaneConfig], Any]] = {
    "/forge/kind": lambda c: c.forge.kind if c.forge else None,
    "/forge/api_url": lambda c: c.forge.api_url if c.forge else None,
    "/forge/context": lambda c: c.forge.context if c.forge else None,
    "/forge/timeout_s": lambda c: c.forge.timeout_s if c.forge else None,
    "/forge/attempts": lambda c: c.forge.attempts if c.forge else None,
    "/forge/drain_timeout_s": lambda c: c.forge.drain_timeout_s if c.forge else None,
}


def expected(where: str) -> Any:
    value = DEFAULTS[where]
    return Listen.parse(value) if where == "/listen" else value


def minimal(tmp_path: Path) -> ControlPlaneConfig:
    path = tmp_path / "cp.yaml"
    path.write_text(MINIMAL)
    return load_config(path, ENV)


def test_the_defaults_are_the_schemas() -> None:
    schema = load_schema("control-plane")
    assert DEFAULTS["/litellm/write_concurrency"] == schema["properties"]["litellm"]["properties"][
        "write_concurrency"]["default"] == 4
    assert set(TAKEN) | set(TAKEN_IN_PUSHGATEWAY) | set(TAKEN_IN_OIDC) | set(TAKEN_IN_FORGE) == set(DEFAULTS), \
        "a schema default this test does not check, or one it lost"


def test_every_default_the_settings_take_is_the_schemas(tmp_path: Path) -> None:
    config = minimal(tmp_path)
    for where, taken in TAKEN.items():
        value = taken(config)
        default = expected(where)
        assert value == default, where
        assert isinstance(value, type(default)) or (type(default) is int and type(value) is float), where


def test_the_pushgateway_defaults_are_the_schemas(tmp_path: Path) -> None:
    path = tmp_path / "cp.yaml"
    path.write_text(MINIMAL + PUSHGATEWAY)
    config = load_config(path, ENV)
    for where, taken in TAKEN_IN_PUSHGATEWAY.items():
        assert taken(config) == expected(where), where
        assert type(taken(config)) in (type(expected(where)), float), where


def test_the_forge_defaults_are_the_schemas(tmp_path: Path) -> None:
    path = tmp_path / "cp.yaml"
    path.write_text(MINIMAL + FORGE)
    config = load_config(path, ENV)
    for where, taken in TAKEN_IN_FORGE.items():
        assert taken(config) == expected(where), where
        assert type(taken(config)) in (type(expected(where)), float), where


def test_the_oidc_defaults_are_the_schemas(tmp_path: Path) -> None:
    path = tmp_path / "cp.yaml"
    path.write_text(MINIMAL + OIDC)
    config = load_config(path, ENV)
    for where, taken in TAKEN_IN_OIDC.items():
        assert taken(config) == expected(where), where
        assert type(taken(config)) in (type(expected(where)), float), where


def test_the_environment_only_settings_take_the_same_defaults(tmp_path: Path) -> None:
    """`fleetllm plan` without --config ran with write_concurrency 8 (job/configfile.py's own default)."""
    from_file, from_env = minimal(tmp_path), settings_from_env(CI_ENV)
    for where, taken in TAKEN.items():
        assert taken(from_env) == taken(from_file) == expected(where), where
    assert config_from_env(CI_ENV).write_concurrency == DEFAULTS["/litellm/write_concurrency"]
    assert reconcile_config(tmp_path / "cp.yaml", ENV).write_concurrency == DEFAULTS["/litellm/write_concurrency"]


def test_no_code_declares_a_default_of_its_own() -> None:
    """The settings dataclasses and the reconciler's view declare none; the Reconciler's is the schema's."""
    classes = [getattr(settings, name) for name in dir(settings)]
    for cls in [c for c in classes if isinstance(c, type) and dataclasses.is_dataclass(c)
                and c.__module__ == settings.__name__]:
        for f in dataclasses.fields(cls):
            assert f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING, \
                f"{cls.__name__}.{f.name} has a default of its own: give it to the schema"
    assert all(f.default is dataclasses.MISSING for f in dataclasses.fields(JobConfig))
    (concurrency,) = [f for f in dataclasses.fields(Reconciler) if f.name == "write_concurrency"]
    assert concurrency.default == DEFAULTS["/litellm/write_concurrency"]
    source = (ROOT / "reconciler" / "fleetllm" / "settings.py").read_text()
    assert not re.search(r"\.get\([^()]*,", source), "a .get(key, default) in the builder: read the schema's"


def test_the_environment_only_settings_keep_secrets_secret() -> None:
    config = config_from_env({**CI_ENV, "VAST_API_KEY": "vast-key-0123", "FLEETLLM_LEGACY_API_KEY": "sk-legacy"})
    assert isinstance(config.litellm_master_key, Secret)
    assert config.litellm_master_key.reference == "${env:LITELLM_MASTER_KEY}"
    assert isinstance(config.legacy_key, Secret)
    (access,) = config.providers.values()
    assert isinstance(access.api_key, Secret)
    assert access.api_key.reveal() == "vast-key-0123"
    shown = repr(config)
    assert not any(value in shown for value in ("sk-master-0123", "vast-key-0123", "sk-legacy", SALT))


@pytest.mark.parametrize(("variable", "value", "message"), [
    ("FLEETLLM_LEGACY_API_KEY", " sk-legacy-with-space\n", "FLEETLLM_LEGACY_API_KEY: .* leading or trailing whitespace"),
    ("FLEETLLM_VLLM_API_SALT", "CHANGE_ME_0123456789", "FLEETLLM_VLLM_API_SALT: .*placeholder"),
])
def test_the_environment_only_settings_run_the_files_checks(variable: str, value: str, message: str) -> None:
    """The legacy-key whitespace check was skipped without --config."""
    with pytest.raises(ConfigurationError, match=message) as caught:
        config_from_env({**CI_ENV, variable: value})
    assert value.strip() not in str(caught.value)


def test_the_environment_only_settings_name_what_is_missing() -> None:
    with pytest.raises(ConfigurationError, match="LITELLM_MASTER_KEY, FLEETLLM_VLLM_API_SALT not set"):
        settings_from_env({"LITELLM_URL": "http://127.0.0.1:4000"})
    with pytest.raises(ConfigurationError, match="LITELLM_URL must be the proxy's http"):
        settings_from_env({**CI_ENV, "LITELLM_URL": "ftp://x"})


# Where a secret may be revealed: where it is put on the wire (a client's headers, libpq's parameters),
# compared (the server's token checks) or checked by the settings' builder. runtime.py's two go when the
# server passes the Secrets themselves (its rewrite, issue 17 point 8); wiring.py's legacy key goes into
# the rendered bearers. admin_client.py puts the CLI's admin token in its Authorization header.
REVEALED = {
    "adapters/litellm.py": 1, "adapters/providers.py": 1, "adapters/state/postgres.py": 1, "adapters/state/__init__.py": 1,
    "adapters/admin_client.py": 1,
    "settings.py": 16, "cli/serve.py": 1, "job/wiring.py": 1,
    "server/auth.py": 1, "server/session.py": 3, "server/runtime.py": 1,
    # a presented token compared with a configured one in constant time (matches: tokens, fleet key, metrics)
    "core/secret.py": 1,
    # single sign-on: the client's secret onto the wire (the token endpoint, adapters/oidc.py) and into the
    # session cookies' signing key (server/session.py)
    "adapters/oidc.py": 1,
    # notifications: the target's secrets onto the wire (adapters/notify.py), into the list of strings
    # scrubbed from error text (core/notify.py Target.secrets), the URL checked by the builder (settings.py)
    "core/notify.py": 3, "adapters/notify.py": 3,
    "demo/load.py": 1,  # the scenarios' callers present the demo proxy's master key
    # the Pushgateway's URL and basic auth onto the wire (prometheus_client's push handler), and the
    # URL checked by the builder (settings.py)
    "job/pushmetrics.py": 3,
    # the forge's token onto the wire (adapters/forge.py), and checked not empty by the builder (settings.py)
    "adapters/forge.py": 1,
}


def test_secrets_are_revealed_only_where_used() -> None:
    package = ROOT / "reconciler" / "fleetllm"
    found = {str(p.relative_to(package)): p.read_text().count(".reveal()") for p in package.rglob("*.py")}
    assert {k: v for k, v in found.items() if v} == REVEALED
