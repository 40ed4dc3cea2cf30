"""Conformance group 9 (config validation and secret references, llmhop.md §7-§8), in process.

The same loader runs under `--check` and at start-up; test_check_cli.py drives it as a process.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fleetllm_gateway.config import DEFAULT_MAX_CONCURRENT, ConfigError, GatewayConfig, parse_config

URL = "http://127.0.0.1:8001"


def _config(**top: Any) -> str:
    document: dict[str, Any] = {"models": {"m": {"url": URL}}}
    document.update(top)
    return json.dumps(document)


def _model(**fields: Any) -> str:
    return json.dumps({"models": {"m": {"url": URL, **fields}}})


def _problems(text: str, *, expand: bool = True, env: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_config(text, expand_secrets=expand, env=env or {})
    return caught.value.problems


def _load(text: str, *, expand: bool = True, env: dict[str, str] | None = None) -> GatewayConfig:
    return parse_config(text, expand_secrets=expand, env=env or {})


@pytest.mark.parametrize(("text", "message"), [
    (_config(maxBodyByes=1), 'config: unknown field "maxBodyByes"'),
    (_model(urll="x"), 'config: models.m: unknown field "urll"'),
    (_config() + _config(), "config: multiple JSON values in config"),
    (_config(port=65536), "config: port 65536 is outside 0..65535"),
    (_config(port=-1), "config: port -1 is outside 0..65535"),
    (_config(maxBodyBytes=-1), "config: maxBodyBytes must not be negative"),
    (_config(maxConcurrentRequests=-1), "config: maxConcurrentRequests must not be negative"),
    (json.dumps({"models": {}}), "config: no models configured"),
    (json.dumps({"port": 1}), "config: no models configured"),
    (json.dumps({"models": {"": {"url": URL}}}), "config: model name must not be empty"),
    (_model(headers={"X Y": "1"}), 'config: models.m.headers: invalid header name "X Y"'),
    (_model(headers={"x-key": "1", "X-KEY": "2"}), 'config: models.m.headers: duplicate header "X-Key"'),
    (_model(headers={"X-Key": "a\nb"}), "config: models.m.headers.X-Key: invalid header value"),
    (_model(headers={"X-Key": "a\x7fb"}), "config: models.m.headers.X-Key: invalid header value"),
    (_config(authTokens=[""]), "config: authTokens[0]: empty token"),
    (_config(authTokens=["ok", "a\x01b"]), "config: authTokens[1]: invalid token"),
    (_config(host="[::1]"), 'config: host "[::1]" must be an IP address or a host name, without brackets or port'),
    (_config(host="127.0.0.1:80"), 'config: host "127.0.0.1:80" must be an IP address or a host name, '
                                   "without brackets or port"),
    (_config(port="8080"), "config: port: expected an integer, got a string"),
    (_config(port=80.5), "config: port: expected an integer, got a number"),
    (_config(authTokens="tok"), "config: authTokens: expected an array of strings, got a string"),
    (_model(unlisted="yes"), "config: models.m.unlisted: expected a boolean, got a string"),
    (_model(headers=[]), "config: models.m.headers: expected an object, got an array"),
    (_model(headers={"X-Key": 1}), "config: models.m.headers.X-Key: expected a string, got a number"),
    (f'{{"port": 1, "port": 2, "models": {{"m": {{"url": "{URL}"}}}}}}', 'config: duplicate key "port"'),
    ("", "config: empty file: expected a JSON object"),
    ("{", "config: invalid JSON at line 1 column 2"),
    ("[]", "config: top level: expected an object, got an array"),
    (_config(queueTimeoutSeconds=-1), "config: queueTimeoutSeconds must be at least 0"),
    (_config(connectTimeoutSeconds=0), "config: connectTimeoutSeconds must be greater than 0"),
    (_model(maxQueuedRequests=-2), "config: models.m.maxQueuedRequests must not be negative"),
])
def test_invalid_configs_name_the_problem(text: str, message: str) -> None:
    problems = _problems(text)
    assert any(p.startswith(message) for p in problems), problems


@pytest.mark.parametrize(("url", "message"), [
    ("localhost:8000", 'url "localhost:8000" must be an absolute http(s) or unix URL'),
    ("http:///path", 'url "http:///path" must be an absolute http(s) or unix URL'),
    ("ftp://x", 'url "ftp://x" must be an absolute http(s) or unix URL'),
    ("", 'url "" must be an absolute http(s) or unix URL'),
    ("http://x:port", 'url "http://x:port" must be an absolute http(s) or unix URL'),
    ("http://x/\n", 'url "http://x/\n" must be an absolute http(s) or unix URL'),
    ("http://u:p@x", "http(s) backend URL must not contain credentials or a fragment"),
    ("http://x/#f", "http(s) backend URL must not contain credentials or a fragment"),
    ("unix://relative.sock", 'url "unix://relative.sock" must be unix:///<absolute socket path>'),
    ("unix:///a.sock?x=1", 'url "unix:///a.sock?x=1" must be unix:///<absolute socket path>'),
    ("ftp://user:s3cret@x/", 'url "ftp://***@x/" must be an absolute http(s) or unix URL'),
])
def test_model_urls(url: str, message: str) -> None:
    assert _problems(_model(url=url)) == [f"config: models.m: {message}"]


@pytest.mark.parametrize("url", ["http://127.0.0.1:8001", "https://api.openai.com", "http://h/base?backend=1",
                                 "http://[::1]:9000/v1", "unix:///run/vllm/gemma.sock", "HTTP://Example.COM"])
def test_good_urls(url: str) -> None:
    assert _load(_model(url=url)).models[0].url == url


def test_defaults_and_listen_address() -> None:
    config = _load(_config(host="::1", port=0))
    assert (config.port, config.listen_address) == (8080, "[::1]:8080")
    assert config.max_body_bytes == 100 * 1024 * 1024
    assert config.models[0].max_concurrent == DEFAULT_MAX_CONCURRENT
    assert _load(_config()).host == ""


def test_every_problem_is_reported_at_once() -> None:
    problems = _problems(json.dumps({"port": 70000, "bogus": 1, "models": {
        "a": {"url": "ftp://x"}, "b": {"url": URL, "headers": {"X Y": "1"}}}}))
    assert len(problems) == 4, problems


# §8 secret references


@pytest.mark.parametrize(("token", "message"), [
    ("${cred:a/b}", 'invalid credential name "a/b"'),
    ("${cred:x}", 'credential "x" requested but $CREDENTIALS_DIRECTORY is not set'),
    ("${env:NOPE_NOT_SET}", 'env var "NOPE_NOT_SET" not set'),
    ("${file:tok}", 'secret file "tok" must be an absolute path'),
    ("$NAME", '"NAME" is not a cred:, env: or file: reference, write $$ for a literal $'),
    ("${NAME}", '"NAME" is not a cred:, env: or file: reference, write $$ for a literal $'),
    ("pa$sword", '"sword" is not a cred:, env: or file: reference, write $$ for a literal $'),
    ("$1", '"1" is not a cred:, env: or file: reference'),
    ("$*", '"*" is not a cred:, env: or file: reference'),
    # LLMhop's quirks, rejected here: `${}` vanishing, an unclosed `${` losing two characters.
    ("x${}y", "empty reference ${}"),
    ("${}", "empty reference ${}"),
    ("abc${def", "unclosed ${ reference"),
    ("${env:}", "empty env: reference"),
])
def test_bad_references(token: str, message: str) -> None:
    problems = _problems(_config(authTokens=[token]))
    assert any(p.startswith(f"config: authTokens[0]: {message}") for p in problems), problems


@pytest.mark.parametrize("token", ["${cred:a/b}", "$NAME", "x${}y", "${}", "abc${def", "${file:rel}", "${env:}"])
def test_check_mode_catches_reference_syntax(token: str) -> None:
    assert _problems(_config(authTokens=[token]), expand=False)


def test_check_mode_reads_nothing() -> None:
    text = _config(authTokens=["${env:NOPE_NOT_SET}", "${file:/nonexistent/x}", "${cred:c}"])
    config = _load(text, expand=False)
    assert config.auth_tokens == ("${env:NOPE_NOT_SET}", "${file:/nonexistent/x}", "${cred:c}")
    assert len(_problems(text)) == 3  # at start-up each one fails, all reported together


def test_references_expand(tmp_path: Path) -> None:
    (tmp_path / "creds").mkdir()
    (tmp_path / "creds" / "client").write_text("from-cred\n")
    (tmp_path / "file").write_text("from-file\r\n")
    (tmp_path / "two").write_text("two\n\n")
    env = {"CREDENTIALS_DIRECTORY": str(tmp_path / "creds"), "KEY": "from-env", "EMPTY": ""}
    text = json.dumps({"authTokens": ["${cred:client}", f"${{file:{tmp_path}/file}}", "${env:KEY}", "a$${env:X}",
                                      "a $ b $"],
                       "models": {"m": {"url": URL, "headers": {"Authorization": "Bearer ${env:KEY}",
                                                                "X-Empty": "${env:EMPTY}"}}}})
    config = _load(text, env=env)
    assert config.auth_tokens == ("from-cred", "from-file", "from-env", "a${env:X}", "a $ b $")
    assert config.models[0].headers == (("Authorization", "Bearer from-env"), ("X-Empty", ""))
    # Exactly one trailing newline goes: the second makes an invalid token.
    assert _problems(json.dumps({"authTokens": [f"${{file:{tmp_path}/two}}"], "models": {"m": {"url": URL}}}),
                     env=env) == ["config: authTokens[0]: invalid token"]
    # Set but empty: fine in a header, not as a token.
    assert _problems(_config(authTokens=["${env:EMPTY}"]), env=env) == ["config: authTokens[0]: empty token"]


def test_secrets_stay_out_of_repr_and_errors(tmp_path: Path) -> None:
    env = {"KEY": "s3cret-value"}
    config = _load(json.dumps({"authTokens": ["${env:KEY}"], "models": {"m": {
        "url": URL, "headers": {"Authorization": "Bearer ${env:KEY}"}}}}), env=env)
    assert "s3cret" not in repr(config)
    (tmp_path / "bad").write_text("s3cret\x01value")
    problems = _problems(_config(authTokens=[f"${{file:{tmp_path}/bad}}"]))
    assert problems == ["config: authTokens[0]: invalid token"]


# -- a config written from a box JSON (--box-json; issue 27) ------------------------------------------------

BOX_JSON_REFUSED = [
    ({"models": {"m": {"url": URL, "headers": {"X-Leak": "${file:/etc/passwd}"}}}},
     "config: models.m.headers.X-Leak: ${file:/etc/passwd} is refused in a config from a box JSON"),
    ({"models": {"m": {"url": URL, "headers": {"Authorization": "Bearer ${env:FLEETLLM_FLEET_KEY}"}}}},
     "config: models.m.headers.Authorization: ${env:FLEETLLM_FLEET_KEY} is refused in a config from a box JSON"),
    ({"authTokens": ["${env:PATH}"], "models": {"m": {"url": URL}}},
     "config: authTokens[0]: ${env:PATH} is refused in a config from a box JSON"),
    ({"models": {"m": {"url": "http://203.0.113.5:8001", "headers": {"Authorization": "Bearer ${cred:bearer-m}"}}}},
     "config: models.m.url: a config from a box JSON routes only to this box's servers"),
    ({"models": {"m": {"url": "https://upstream.example/v1"}}},
     "config: models.m.url: a config from a box JSON routes only to this box's servers"),
]


@pytest.mark.parametrize(("document", "message"), BOX_JSON_REFUSED)
def test_a_box_json_config_reads_only_credentials_and_routes_only_to_this_box(document: dict[str, Any],
                                                                              message: str, tmp_path: Path) -> None:
    """The box JSON is the control plane's: the box's files and environment (its fleet key, PATH) are not
    its to send upstream. A standalone LLMhop config (no --box-json) keeps every reference and any url."""
    env = {"FLEETLLM_FLEET_KEY": "fleet-key-of-the-box", "PATH": "/usr/bin", "CREDENTIALS_DIRECTORY": str(tmp_path)}
    (tmp_path / "bearer-m").write_text("bearer-of-m\n")
    for expand in (True, False):  # at start-up and under --check alike
        with pytest.raises(ConfigError) as caught:
            parse_config(json.dumps(document), expand_secrets=expand, env=env, box_json=True)
        (problem,) = caught.value.problems
        assert problem.startswith(message)
        assert "fleet-key-of-the-box" not in problem and "root:" not in problem
    standalone = parse_config(json.dumps(document), expand_secrets=False, env=env)
    assert standalone.models[0].name == "m"


def test_a_box_json_config_reads_its_credentials(tmp_path: Path) -> None:
    (tmp_path / "bearer-m").write_text("bearer-of-m\n")
    (tmp_path / "client-token").write_text("client\n")
    document = {"authTokens": ["${cred:client-token}"],
                "models": {"m": {"url": URL, "headers": {"Authorization": "Bearer ${cred:bearer-m}"}},
                           "s": {"url": "unix:///run/vllm.sock"}}}
    config = parse_config(json.dumps(document), env={"CREDENTIALS_DIRECTORY": str(tmp_path)}, box_json=True)
    assert config.auth_tokens == ("client",)
    assert config.models[0].headers == (("Authorization", "Bearer bearer-of-m"),)
