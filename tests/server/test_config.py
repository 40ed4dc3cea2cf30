"""The control-plane config file: schema, unknown keys, secret references, start-up resolution."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fleetllm.errors import ConfigurationError as ConfigError
from fleetllm.settings import ApproveTarget, load_config
from tests.conftest import ROOT
from tests.server.conftest import ENV, FLEET_KEY, base_config, write_config

EXAMPLE_ENV = {"FLEETLLM_FLEET_KEY": "example-fleet-key-0123", "FLEETLLM_VLLM_API_SALT": "example-salt-0123456789",
               "FLEETLLM_LEGACY_API_KEY": "sk-legacy-example"}


def problems(tmp_path: Path, text: str, env: dict[str, str] | None = None) -> str:
    path = tmp_path / "cp.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_config(path, env=ENV if env is None else env)
    return str(caught.value)


def test_example_config_loads() -> None:
    config = load_config(ROOT / "examples" / "control-plane.yaml", env=EXAMPLE_ENV)
    assert config.repo.path == ROOT / "fleet-repo-example"
    assert config.repo.branch == "main"
    assert config.secrets.fleet_key is not None
    assert config.secrets.fleet_key.reveal() == "example-fleet-key-0123"
    assert config.secrets.fleet_key.reference == "${env:FLEETLLM_FLEET_KEY}"
    assert config.state.url.startswith("sqlite:///")
    assert config.listen.is_loopback
    assert config.tls is None


def test_full_config(tmp_path: Path) -> None:
    secret_file = tmp_path / "master"
    secret_file.write_text("sk-master-from-file\n")
    cert = tmp_path / "c.pem"
    cert.write_text("x")
    document = base_config(tmp_path, tmp_path / "s.db")
    document.update({
        "listen": "[::]:8443", "tls": {"cert": "c.pem", "key": str(cert)}, "trusted_proxies": ["10.0.0.0/8", "::1"],
        "litellm": {"url": "http://127.0.0.1:4000", "master_key": f"${{file:{secret_file}}}", "timeout_s": 10,
                    "write_concurrency": 2},
        "providers": {"vast": {"api_key": "${env:FLEET_KEY}"}, "static": {}},
        "reconcile": {"dry_run": True},
        "repo": {**document["repo"], "approve": {"target": "tracked"}},
    })
    config = load_config(write_config(tmp_path / "cp.yaml", document), env=ENV)
    assert config.listen.host == "::"
    assert config.listen.port == 8443
    assert config.listen.bind == "[::]:8443"
    assert config.tls is not None
    assert config.tls.cert == tmp_path / "c.pem"
    assert [str(n) for n in config.trusted_proxies] == ["10.0.0.0/8", "::1/128"]
    assert config.litellm is not None
    assert config.litellm.master_key is not None
    assert config.litellm.master_key.reveal() == "sk-master-from-file"
    assert config.providers.vast is not None
    assert config.providers.vast.api_key.reveal() == FLEET_KEY
    assert config.providers.static
    assert config.providers.runpod is None
    assert config.reconcile.dry_run
    assert config.reconcile.enabled
    assert config.repo.approve_target is ApproveTarget.TRACKED
    assert FLEET_KEY not in repr(config)


def test_unknown_keys_rejected_with_position(tmp_path: Path) -> None:
    message = problems(tmp_path, "repo: {path: /x, brnach: main}\nsecrets: {vllm_api_salt: '${env:SALT}'}\n"
                                 "state: {url: 'sqlite:///s.db'}\nlisten_on: x\n")
    assert "cp.yaml:1:18: /repo/brnach: unknown key 'brnach'; did you mean 'branch'?" in message
    assert "unknown key 'listen_on'" in message


def test_literal_secret_rejected_without_echo(tmp_path: Path) -> None:
    message = problems(tmp_path, "repo: {path: /x}\nsecrets: {vllm_api_salt: hunter2-literal-salt, fleet_key: 12345}\n"
                                 "state: {url: 'sqlite:///s.db'}\nadmin_tokens: [plain-admin-token]\n")
    assert "/secrets/vllm_api_salt: not a secret reference" in message
    assert "/secrets/fleet_key: not a secret reference" in message
    assert "/admin_tokens/0: not a secret reference" in message
    for secret in ("hunter2-literal-salt", "12345", "plain-admin-token"):
        assert secret not in message


def test_unresolvable_references_all_reported(tmp_path: Path) -> None:
    message = problems(tmp_path, "repo: {path: /x}\nsecrets: {vllm_api_salt: '${env:NOPE}', "
                                 "fleet_key: '${file:/no/such/file}'}\nstate: {url: 'sqlite:///s.db'}\n"
                                 "viewer_tokens: ['${cred:viewer}']\n", env={})
    assert 'env var "NOPE" not set' in message
    assert 'cannot read secret file "/no/such/file"' in message
    assert "$CREDENTIALS_DIRECTORY is not set" in message


def test_weak_salt_and_short_token(tmp_path: Path) -> None:
    message = problems(tmp_path, "repo: {path: /x}\nsecrets: {vllm_api_salt: '${env:S}'}\n"
                                 "state: {url: 'sqlite:///s.db'}\nadmin_tokens: ['${env:T}']\n",
                       env={"S": "CHANGE_ME_salt_value", "T": "short"})
    assert "CHANGE_ME" in message
    assert "admin_tokens[0] (${env:T}) is 5 characters; admin_tokens need at least 24" in message
    assert "CHANGE_ME_salt_value" not in message
    assert "'short'" not in message


def test_short_salt_loads_and_a_previous_salt_for_a_rotation(tmp_path: Path) -> None:
    path = tmp_path / "cp.yaml"
    path.write_text("repo: {path: /x}\nsecrets: {vllm_api_salt: '${env:S}', previous_vllm_api_salt: '${env:P}'}\n"
                    "state: {url: 'sqlite:///s.db'}\n")
    config = load_config(path, env={"S": "a-new-long-salt-0123456789", "P": "old12chars!!"})
    assert config.secrets.vllm_api_salt.short is False
    previous = config.secrets.previous_vllm_api_salt
    assert previous is not None and previous.short and previous.derive("h", 8001) != config.secrets.vllm_api_salt.derive(
        "h", 8001)
    message = problems(tmp_path, "repo: {path: /x}\nsecrets: {vllm_api_salt: '${env:S}', "
                                 "previous_vllm_api_salt: '${env:P}'}\nstate: {url: 'sqlite:///s.db'}\n",
                       env={"S": "a-new-long-salt-0123456789", "P": "CHANGE_ME_old"})
    assert "previous_vllm_api_salt" in message and "CHANGE_ME_old" not in message
def test_tokens_need_24_characters_and_the_message_names_the_key(tmp_path: Path) -> None:
    """Issue 16, finding 12: a minimum length for admin and viewer tokens, named in the refusal."""
    document = ("repo: {path: /x}\nsecrets: {vllm_api_salt: '${env:S}'}\nstate: {url: 'sqlite:///s.db'}\n"
                "admin_tokens: ['${env:A}']\nviewer_tokens: ['${env:OK}', '${env:V}']\n")
    message = problems(tmp_path, document, env={"S": "a-good-salt-for-the-tests-0123", "A": "a" * 23, "V": "v" * 16,
                                                "OK": "o" * 24})
    assert "/admin_tokens/0: admin_tokens[0] (${env:A}) is 23 characters; admin_tokens need at least 24" in message
    assert "/viewer_tokens/1: viewer_tokens[1] (${env:V}) is 16 characters" in message
    assert "viewer_tokens[0]" not in message
    assert "secrets.token_urlsafe" in message  # how to make one
    assert "a" * 23 not in message


def test_repo_needs_exactly_one_source(tmp_path: Path) -> None:
    both = problems(tmp_path, "repo: {path: /x, url: 'file:///y'}\nsecrets: {vllm_api_salt: '${env:SALT}'}\n"
                              "state: {url: 'sqlite:///s.db'}\n")
    assert "exactly one of url" in both
    tracked = problems(tmp_path, "repo: {url: 'file:///y', approve: {target: tracked}}\n"
                                 "secrets: {vllm_api_salt: '${env:SALT}'}\nstate: {url: 'sqlite:///s.db'}\n")
    assert "tracked needs a local path" in tracked


def test_bad_values(tmp_path: Path) -> None:
    message = problems(tmp_path, "repo: {path: /x}\nsecrets: {vllm_api_salt: '${env:SALT}'}\n"
                                 "state: {url: 'mysql://x'}\nlisten: nowhere\ntrusted_proxies: [10.0.0.0/33]\n"
                                 "tls: {cert: /no/cert, key: /no/key}\n")
    assert "/state/url" in message
    assert "/listen" in message
    assert "not an address range" not in message  # schema errors stop before the typed build
    message = problems(tmp_path, "repo: {path: /x}\nsecrets: {vllm_api_salt: '${env:SALT}'}\n"
                                 "state: {url: 'sqlite:///s.db'}\ntrusted_proxies: [10.0.0.0/33]\n"
                                 "tls: {cert: /no/cert, key: /no/key}\n")
    assert "'10.0.0.0/33' is not an address range" in message
    assert "/tls/cert: /no/cert: no such file" in message


def test_per_network_allowance_and_exempt_networks(tmp_path: Path) -> None:
    head = "repo: {path: /x}\nsecrets: {vllm_api_salt: '${env:SALT}'}\nstate: {url: 'sqlite:///s.db'}\n"
    path = tmp_path / "ok.yaml"
    path.write_text(head + "server: {max_connections_per_network: 2048, "
                           "network_cap_exempt: [203.0.113.0/24, '2001:db8:5::/48', 198.51.100.7]}\n")
    limits = load_config(path, env=ENV).limits
    assert limits.max_connections_per_network == 2048
    assert [str(n) for n in limits.network_cap_exempt] == ["203.0.113.0/24", "2001:db8:5::/48", "198.51.100.7/32"]
    message = problems(tmp_path, head + "server: {max_connections_per_peer: 64, max_connections_per_network: 32, "
                                        "network_cap_exempt: [203.0.113.9/24, 10.0.0.0/33, nowhere]}\n")
    assert ("/server/max_connections_per_network: 32 is below server.max_connections_per_peer (64): one address "
            "could not open the connections it may hold") in message
    assert ("/server/network_cap_exempt/0: '203.0.113.9/24' has host bits set: write the network 203.0.113.0/24 "
            "(or 203.0.113.9/32 for that one address)") in message
    assert "/server/network_cap_exempt/1: '10.0.0.0/33' is not a network such as 203.0.113.0/24" in message
    assert "/server/network_cap_exempt/2: 'nowhere' is not a network" in message


def test_unreadable_and_empty_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read the config file"):
        load_config(tmp_path / "missing.yaml")
    assert "is empty" in problems(tmp_path, "")
    assert "duplicate key" in problems(tmp_path, "repo: {}\nrepo: {}\n")


def test_env_defaults_to_process_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    config = load_config(write_config(tmp_path / "cp.yaml", base_config(tmp_path, tmp_path / "s.db")))
    assert config.secrets.fleet_key is not None
    assert config.secrets.fleet_key.reveal() == os.environ["FLEET_KEY"]
