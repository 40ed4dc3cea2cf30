"""The forge section of the control plane's config: the token a reference only and never quoted back,
GitHub's defaults, plain http only to loopback, no credential in a URL, and `fleetllm serve` reading no
token (it never sets a status)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetllm.errors import ConfigurationError
from fleetllm.settings import RECONCILE_ONLY, ControlPlaneConfig, load_config

TOKEN = "ghp_settingsTokenValue0123456789"
ENV = {"SALT": "salt-0123456789abcdef", "GITHUB_TOKEN": TOKEN}


def config(tmp_path: Path, unread: tuple[str, ...] = (), **forge: Any) -> ControlPlaneConfig:
    document = {"repo": {"path": str(tmp_path)}, "secrets": {"vllm_api_salt": "${env:SALT}"},
                "state": {"url": "sqlite:///state.db"},
                "forge": {"repository": "fleet-org/fleet", "token": "${env:GITHUB_TOKEN}", **forge}}
    path = tmp_path / "cp.yaml"
    path.write_text(yaml.safe_dump(document))
    return load_config(path, ENV, unread=unread)


def refused(tmp_path: Path, **forge: Any) -> str:
    with pytest.raises(ConfigurationError) as caught:
        config(tmp_path, **forge)
    assert TOKEN not in str(caught.value)
    return str(caught.value)


def test_githubs_defaults_and_the_token_wrapped(tmp_path: Path) -> None:
    forge = config(tmp_path).forge
    assert forge is not None and forge.token is not None
    assert (forge.kind, forge.api_url, forge.repository, forge.context) == (
        "github", "https://api.github.com", "fleet-org/fleet", "fleetllm/rollout")
    assert (forge.control_plane_url, forge.timeout_s, forge.attempts, forge.drain_timeout_s) == (None, 10.0, 5, 10.0)
    assert forge.token.reveal() == TOKEN and TOKEN not in repr(forge)
    assert forge.statuses_url("a" * 40) == f"https://api.github.com/repos/fleet-org/fleet/statuses/{'a' * 40}"


def test_github_enterprise_and_a_link_to_the_control_plane(tmp_path: Path) -> None:
    forge = config(tmp_path, api_url="https://ghe.example.com/api/v3/", control_plane_url="https://fleet.example.org/",
                   context="fleetllm/prod").forge
    assert forge is not None
    assert (forge.api_url, forge.control_plane_url, forge.context) == (
        "https://ghe.example.com/api/v3", "https://fleet.example.org", "fleetllm/prod")
    assert config(tmp_path, api_url="http://127.0.0.1:8765").forge is not None  # a fake on loopback
    plain = config(tmp_path, control_plane_url="http://fleet.lan:8080").forge  # a link carries no secret
    assert plain is not None and plain.control_plane_url == "http://fleet.lan:8080"
    assert load_config_without(tmp_path).forge is None


def load_config_without(tmp_path: Path) -> ControlPlaneConfig:
    path = tmp_path / "plain.yaml"
    path.write_text(yaml.safe_dump({"repo": {"path": str(tmp_path)}, "secrets": {"vllm_api_salt": "${env:SALT}"},
                                    "state": {"url": "sqlite:///state.db"}}))
    return load_config(path, ENV)


@pytest.mark.parametrize(("field", "value", "said"), [
    ("api_url", "http://github.internal.example/api/v3", "must be https"),
    ("api_url", "https://user:pw@github.example/api/v3", "carries a credential"),
    ("api_url", "https://github.example/api/v3?x=1", "a query or a fragment"),
    ("control_plane_url", "https://:8080", "not an http(s) URL with a host"),
    ("control_plane_url", "ftp://fleet.example.org", "schema-pattern"),
])
def test_urls_that_would_leak_or_cannot_work_are_refused(tmp_path: Path, field: str, value: str, said: str) -> None:
    message = refused(tmp_path, **{field: value})
    assert f"/forge/{field}" in message and said in message


@pytest.mark.parametrize(("forge", "said"), [
    ({"token": TOKEN}, "/forge/token: not a secret reference"),
    ({"repository": "no-slash"}, "/forge/repository"),
    ({"kind": "gitlab"}, "/forge/kind"),
    ({"token": "${env:MISSING_TOKEN}"}, "MISSING_TOKEN"),
])
def test_a_wrong_section_names_the_field(tmp_path: Path, forge: dict[str, Any], said: str) -> None:
    assert said in refused(tmp_path, **forge)


def test_serve_reads_no_forge_token(tmp_path: Path) -> None:
    document = {"repo": {"path": str(tmp_path)}, "secrets": {"vllm_api_salt": "${env:SALT}"},
                "state": {"url": "sqlite:///state.db"},
                "forge": {"repository": "fleet-org/fleet", "token": "${env:NOT_SET_FOR_SERVE}"}}
    path = tmp_path / "cp.yaml"
    path.write_text(yaml.safe_dump(document))
    forge = load_config(path, ENV, unread=RECONCILE_ONLY).forge
    assert forge is not None and forge.token is None
