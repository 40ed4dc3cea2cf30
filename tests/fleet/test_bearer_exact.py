"""The exact texts and values of fleetllm.core.fleet.bearer that the other tests left loose: mutation testing
(docs/testing.md) showed that changing an error message, the salt's repr, the fingerprints' prefixes or
the CRLF rule went unnoticed. Golden values computed independently with sha256sum."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetllm.core.fleet.bearer import (
    SHORT_SALT_WARNING,
    Salt,
    SaltError,
    bearer_fingerprint,
    load_legacy_key,
    load_salt,
    read_secret_file,
)

SALT = "test-salt-0123456789abcdef"
BEARER = "sk-vllm-sFX8t432i_1XpTYS4PP_Kpesd0C9dg29mK5uwFtO6Jg"


def test_repr_and_str_say_redacted_exactly() -> None:
    assert repr(Salt(SALT)) == "Salt(<redacted>)"
    assert str(Salt(SALT)) == "Salt(<redacted>)"


def test_salt_fingerprint_golden() -> None:
    # printf 'fleetllm.salt.fingerprint\ntest-salt-0123456789abcdef' | sha256sum | cut -c1-12
    assert Salt(SALT).fingerprint() == "ed0d83692bbf"


def test_bearer_fingerprint_golden() -> None:
    # printf 'sk-vllm-sFX8...' | sha256sum | cut -c1-16
    assert bearer_fingerprint(BEARER) == "sha256:f1db63f3bb1ba35d"


@pytest.mark.parametrize(("bad", "message"), [
    ("", "the bearer salt is empty"),
    (" padded-salt-0123456789", "the bearer salt has leading or trailing whitespace; remove it "
                                "(a salt file may end in one newline)"),
    ("change_me-0123456789abcdef", "the bearer salt is still a CHANGE_ME placeholder"),
])
def test_salt_messages(bad: str, message: str) -> None:
    with pytest.raises(SaltError) as info:
        Salt(bad)
    assert str(info.value) == message


def test_a_short_salt_works_with_a_warning_from_fifteen_characters_down() -> None:
    # A short salt may already protect a running fleet (issue 20): it is never refused, only warned about.
    assert Salt("x" * 16).derive("h", 1).startswith("sk-vllm-")
    assert not Salt("x" * 16).short and Salt("x" * 16).warning() is None
    short = Salt("x" * 15)
    assert short.short and short.derive("h", 1).startswith("sk-vllm-")
    assert short.warning() == SHORT_SALT_WARNING
    assert SHORT_SALT_WARNING.startswith("the bearer salt is shorter than 16 characters: it still works")
    assert "x" * 15 not in SHORT_SALT_WARNING


def test_derive_messages() -> None:
    with pytest.raises(ValueError) as info:
        Salt(SALT).derive("", 8001)
    assert str(info.value) == "cannot derive a bearer for an empty host"
    with pytest.raises(ValueError) as info:
        Salt(SALT).derive("h", 0)
    assert str(info.value) == "cannot derive a bearer for port 0: need a positive integer"
    assert Salt(SALT).derive("h", 1).startswith("sk-vllm-")  # 1 is the smallest port


def test_secret_file_loses_one_crlf_or_lf(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    # read_text reads CRLF as LF, so one CRLF goes like one LF
    for written, read in (("abc\r\n", "abc"), ("abc\n", "abc"), ("abc", "abc"), ("abc\r\n\r\n", "abc\n"),
                          ("ab\n\n", "ab\n")):
        path.write_bytes(written.encode())
        assert read_secret_file(path) == read, written


def test_salt_and_legacy_key_come_from_the_process_environment_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEETLLM_VLLM_API_SALT", SALT)
    monkeypatch.setenv("FLEETLLM_LEGACY_API_KEY", "sk-legacy-from-env")
    assert load_salt(None).derive("203.0.113.10", 8001) == BEARER
    assert load_legacy_key(None) == "sk-legacy-from-env"
    monkeypatch.delenv("FLEETLLM_LEGACY_API_KEY")
    assert load_legacy_key(None) is None


def test_salt_and_legacy_key_messages(tmp_path: Path) -> None:
    with pytest.raises(SaltError) as info:
        load_salt(None, env={})
    assert str(info.value) == "no bearer salt: pass --salt-file FILE or set FLEETLLM_VLLM_API_SALT"
    with pytest.raises(SaltError) as info:
        load_salt(str(tmp_path / "none"), env={})
    assert str(info.value) == f"cannot read the salt file {tmp_path / 'none'}: No such file or directory"
    with pytest.raises(SaltError) as info:
        load_legacy_key(str(tmp_path / "none"), env={})
    assert str(info.value) == f"cannot read the legacy key file {tmp_path / 'none'}: No such file or directory"
    with pytest.raises(SaltError) as info:
        load_legacy_key(None, env={"FLEETLLM_LEGACY_API_KEY": " sk-padded"})
    assert str(info.value) == "the legacy shared key has leading or trailing whitespace; remove it"
    assert load_legacy_key(None, env={"FLEETLLM_LEGACY_API_KEY": ""}) is None
