"""vLLM options that run code or read files on the box validate only with the recipe's explicit allow
(fleetllm.core.fleet.options, rule option-not-allowed), however they are spelled."""

from __future__ import annotations

import pytest

from fleetllm.core.fleet.options import RISKY_OPTIONS, risky_option
from tests.fleet.helpers import MODELS, only, validate


def with_m2(block: str) -> str:
    return MODELS.replace("{model: org/m2,", "{" + block + ", model: org/m2,")


@pytest.mark.parametrize("args", [
    '["--trust-remote-code"]', '["--tool-parser-plugin", "/tmp/p.py"]', '["--middleware", "x.y"]',
    '["--otlp-traces-endpoint", "http://198.51.100.1:4317"]', '["--chat-template", "/etc/passwd"]',
    '["--allowed-local-media-path", "/"]',
    '["--trust_remote_code"]', '["--Trust-Remote"]', '["--middleware=x.y"]', '["--chat-template=/etc/shadow"]',
    '["-sc", "{}"]', '["-sc.model=/x"]', '["-s", "{}"]', '["--speculative-config.model", "/x"]',
    '"--allowed-local-media-path /"', '["--hf-token", "hf_x"]',
])
def test_a_risky_option_in_args_needs_an_allow(args: str) -> None:
    finding = only(validate(models=with_m2(f"args: {args}")), "option-not-allowed")
    assert finding.pointer == "/models/m2/vllm/args"
    assert "allow_options" in finding.message


@pytest.mark.parametrize("settings", ["{trust-remote-code: true}", "{chat-template: /etc/passwd}",
                                      "{tool_parser_plugin: /tmp/p.py}", "{kv-transfer-config: {a: 1}}"])
def test_a_risky_option_in_settings_needs_an_allow(settings: str) -> None:
    finding = only(validate(models=with_m2(f"settings: {settings}")), "option-not-allowed")
    assert finding.pointer == "/models/m2/vllm/settings"


def test_the_allow_lets_it_validate() -> None:
    models = with_m2('args: ["--trust-remote-code", "--chat-template", "/opt/t.jinja"], '
                     "allow_options: [trust-remote-code, chat-template]")
    assert validate(models=models).valid


def test_an_allow_is_per_option_and_per_recipe() -> None:
    models = with_m2('args: ["--trust-remote-code", "--middleware", "x.y"], allow_options: [trust-remote-code]')
    assert "--middleware" in only(validate(models=models), "option-not-allowed").message
    other = MODELS.replace("{model: org/m1,", "{args: [--trust-remote-code], model: org/m1,")
    other = other.replace("{model: org/m2,", "{allow_options: [trust-remote-code], model: org/m2,")
    assert only(validate(models=other), "option-not-allowed").pointer == "/models/m1/vllm/args"


def test_config_is_managed_and_no_allow_admits_it() -> None:
    """`--config FILE` reads flags from a box file, managed ones included: refused outright (the box refuses
    it too), and an allow of it is no allow at all."""
    models = with_m2('args: ["--config", "/tmp/c.yaml"], allow_options: [config]')
    found = validate(models=models)
    assert only(found, "managed-flag").pointer == "/models/m2/vllm/args"
    assert only(found, "unknown-allowed-option").pointer == "/models/m2/vllm/allow_options"


def test_a_misspelt_allow_is_refused() -> None:
    finding = only(validate(models=with_m2("allow_options: [trust-remote-cod]")), "unknown-allowed-option")
    assert finding.pointer == "/models/m2/vllm/allow_options"


@pytest.mark.parametrize("token", ["--model", "--dtype", "--no-trust-remote-code", "--max-num-seqs", "-tp",
                                   "--chat-template-content-format", "--tokenizer-mode", "-1", "auto"])
def test_ordinary_options_need_no_allow(token: str) -> None:
    assert risky_option(token) is None


def test_every_risky_option_says_what_it_does() -> None:
    assert all(RISKY_OPTIONS.values()) and len(RISKY_OPTIONS) >= 40
