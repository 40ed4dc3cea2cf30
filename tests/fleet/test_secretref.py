"""Secret references: ${env:}, ${file:}, ${cred:}, $$ and every rejected form."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleetllm_contract.secretref import Reference, SecretRefError, check, expand, parse, references


def test_plain_text_and_literal_dollars() -> None:
    assert expand("abc", env={}) == "abc"
    assert expand("a $ b $", env={}) == "a $ b $"
    assert expand("pa$$word", env={}) == "pa$word"
    assert expand("a$${env:X}", env={}) == "a${env:X}"


def test_env_file_and_cred(tmp_path: Path) -> None:
    secret = tmp_path / "s"
    secret.write_text("from-file\n")
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "tok").write_text("from-cred\r\n")
    env = {"X": "from-env", "CREDENTIALS_DIRECTORY": str(creds)}
    assert expand(f"${{env:X}}/${{file:{secret}}}/${{cred:tok}}", env=env) == "from-env/from-file/from-cred"
    assert references("${env:X}${cred:tok}") == [Reference("env", "X"), Reference("cred", "tok")]


def test_only_one_trailing_newline_is_removed(tmp_path: Path) -> None:
    secret = tmp_path / "s"
    secret.write_text("secret\n\n")
    assert expand(f"${{file:{secret}}}", env={}) == "secret\n"


@pytest.mark.parametrize(("value", "message"), [
    ("$NAME", '"NAME" is not a cred:, env: or file: reference, write $$ for a literal $'),
    ("pa$sword", '"sword" is not a cred:'),
    ("${NAME}", '"NAME" is not a cred:'),
    ("${vault:x}", '"vault:x" is not a cred:'),
    ("x${}y", "empty reference ${}"),
    ("abc${def", "unclosed ${"),
    ("${file:relative/path}", 'secret file "relative/path" must be an absolute path'),
    ("${cred:a/b}", 'invalid credential name "a/b"'),
    ("${env:}", "empty env: reference"),
    ("$1", '"1" is not a cred:'),
    ("$*", '"*" is not a cred:'),
])
def test_rejected_forms(value: str, message: str) -> None:
    assert any(message in e for e in check(value)), check(value)
    with pytest.raises(SecretRefError):
        expand(value, env={"NAME": "x"})


def test_resolution_errors_name_the_reference_and_are_reported_together(tmp_path: Path) -> None:
    with pytest.raises(SecretRefError) as info:
        expand(f"${{env:NOPE}}${{cred:c}}${{file:{tmp_path}/missing}}$BAD", env={})
    problems = info.value.problems
    assert len(problems) == 4
    assert 'env var "NOPE" not set' in problems
    assert any("$CREDENTIALS_DIRECTORY is not set" in p for p in problems)
    assert any(p.startswith(f'cannot read secret file "{tmp_path}/missing"') for p in problems)


def test_check_reads_nothing() -> None:
    assert check("${env:NOT_SET_ANYWHERE}") == []
    assert check("${file:/does/not/exist}") == []


def test_secret_values_never_appear_in_errors(tmp_path: Path) -> None:
    with pytest.raises(SecretRefError) as info:
        expand("${env:SET}${env:UNSET}", env={"SET": "hunter2-secret"})
    assert "hunter2-secret" not in str(info.value)


@given(st.text(max_size=40))
def test_parse_never_crashes_and_literal_text_survives(text: str) -> None:
    parts, errors = parse(text)
    if not errors and "$" not in text:
        assert "".join(p for p in parts if isinstance(p, str)) == text


@given(st.text(alphabet=st.characters(blacklist_characters="$"), max_size=30))
def test_doubling_dollars_always_round_trips(text: str) -> None:
    assert expand(text.replace("x", "$$"), env={}) == text.replace("x", "$")
