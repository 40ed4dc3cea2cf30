"""Bearer derivation: golden vectors computed independently with `openssl dgst -hmac`, and the salt rules."""

from __future__ import annotations

import base64
import hashlib
import hmac
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleetllm.core.fleet.bearer import Salt, SaltError, bearer_fingerprint, load_legacy_key, load_salt
from fleetllm_contract.addresses import normalise_host

# printf 'llmao.vllm.api_key\n203.0.113.10\n8001' | openssl dgst -sha256 -hmac SALT -binary | base64 | tr '+/' '-_'
GOLDEN = [
    ("test-salt-0123456789abcdef", "203.0.113.10", 8001, "sk-vllm-sFX8t432i_1XpTYS4PP_Kpesd0C9dg29mK5uwFtO6Jg"),
    ("another-salt-value-0001", "7h9k2m4n6p", 8003, "sk-vllm-CUq6HV85_F7R1EU3NusJ6UzeTbIHnT-eWwYjwCI5VrY"),
]


@pytest.mark.parametrize(("salt", "host", "port", "expected"), GOLDEN)
def test_golden_vectors(salt: str, host: str, port: int, expected: str) -> None:
    assert Salt(salt).derive(host, port) == expected
    assert len(expected) == len("sk-vllm-") + 43


def test_ipv4_mapped_host_is_normalised() -> None:
    salt = Salt(GOLDEN[0][0])
    assert salt.derive("::ffff:203.0.113.10", 8001) == GOLDEN[0][3]
    assert normalise_host("::FFFF:203.0.113.10") == "203.0.113.10"
    assert normalise_host("2001:db8::1") == "2001:db8::1"


@pytest.mark.parametrize("bad", ["", "  padded-salt-0123456789 ", "CHANGE_ME_please_0123456789"])
def test_unusable_salts_are_refused_without_echoing_them(bad: str) -> None:
    with pytest.raises(SaltError) as info:
        Salt(bad)
    if bad.strip():
        assert bad.strip() not in str(info.value)


def test_a_short_salt_works_with_a_warning() -> None:
    """An existing salt already protects a running fleet (llmao takes any length): refusing it would
    mean a new bearer and a vLLM restart on every box. It derives the contract's bearer, flagged short."""
    salt = Salt("abc123")
    message = b"llmao.vllm.api_key\n203.0.113.10\n8001"
    expected = "sk-vllm-" + base64.urlsafe_b64encode(
        hmac.new(b"abc123", message, hashlib.sha256).digest()).rstrip(b"=").decode()
    assert salt.derive("203.0.113.10", 8001) == expected
    assert salt.short
    warning = salt.warning()
    assert warning is not None and "Rotate the salt" in warning and "abc123" not in warning
    assert not Salt("x" * 16).short and Salt("x" * 16).warning() is None


def test_salt_never_appears_in_repr() -> None:
    salt = Salt("a-very-secret-salt-value")
    assert "a-very-secret" not in repr(salt) and "a-very-secret" not in str(salt)


@pytest.mark.parametrize("port", [0, -1, True])
def test_bad_ports_are_refused(port: int) -> None:
    with pytest.raises(ValueError, match="port"):
        Salt(GOLDEN[0][0]).derive("h", port)


def test_salt_file_loses_exactly_one_trailing_newline(tmp_path: Path) -> None:
    path = tmp_path / "salt"
    path.write_text(GOLDEN[0][0] + "\n")
    assert load_salt(str(path), env={}).derive("203.0.113.10", 8001) == GOLDEN[0][3]
    path.write_text(GOLDEN[0][0] + "\n\n")
    with pytest.raises(SaltError, match="whitespace"):
        load_salt(str(path), env={})


def test_salt_from_environment_and_missing_salt() -> None:
    assert load_salt(None, env={"FLEETLLM_VLLM_API_SALT": GOLDEN[0][0]}).derive("203.0.113.10", 8001) == GOLDEN[0][3]
    with pytest.raises(SaltError, match="FLEETLLM_VLLM_API_SALT"):
        load_salt(None, env={})
    with pytest.raises(SaltError, match="cannot read"):
        load_salt("/nonexistent/salt", env={})


def test_legacy_key_sources(tmp_path: Path) -> None:
    path = tmp_path / "legacy"
    path.write_text("sk-legacy-1\n")
    assert load_legacy_key(str(path), env={}) == "sk-legacy-1"
    assert load_legacy_key(None, env={"FLEETLLM_LEGACY_API_KEY": "sk-legacy-2"}) == "sk-legacy-2"
    assert load_legacy_key(None, env={}) is None


def test_fingerprint_is_stable_and_does_not_contain_the_bearer() -> None:
    bearer = GOLDEN[0][3]
    assert bearer_fingerprint(bearer) == bearer_fingerprint(bearer)
    assert bearer[8:20] not in bearer_fingerprint(bearer)


hosts = st.one_of(st.ip_addresses(v=4).map(str), st.from_regex(r"[a-z0-9]{8,16}", fullmatch=True))
ports = st.integers(min_value=1, max_value=65535)


@given(host=hosts, port=ports, other_port=ports)
def test_bearer_changes_with_port(host: str, port: int, other_port: int) -> None:
    salt = Salt(GOLDEN[0][0])
    assert (salt.derive(host, port) == salt.derive(host, other_port)) == (port == other_port)


@given(host=hosts, other=hosts, port=ports)
def test_bearer_changes_with_host(host: str, other: str, port: int) -> None:
    salt = Salt(GOLDEN[0][0])
    assert (salt.derive(host, port) == salt.derive(other, port)) == (host == other)


@given(port=ports)
def test_bearer_changes_with_salt(port: int) -> None:
    assert Salt(GOLDEN[0][0]).derive("h", port) != Salt(GOLDEN[1][0]).derive("h", port)
