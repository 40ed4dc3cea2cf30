"""The log level: `--log-level`, else FLEETLLM_LOG_LEVEL, else the config's log_level (default: the
schema's), for `serve` and `reconcile`; a bad value is a clear error naming where it came from."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from fleetllm.cli.main import main
from fleetllm.errors import ConfigurationError
from fleetllm.settings import load_config
from fleetllm_contract.logfmt import resolve_level
from tests.server.test_config_defaults import ENV, MINIMAL

FLEETLLM = Path(sys.executable).parent / "fleetllm"


def config(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "cp.yaml"
    path.write_text(MINIMAL + extra)
    return path


def test_the_file_and_the_environment(tmp_path: Path) -> None:
    assert load_config(config(tmp_path), ENV).log_level == "info"
    assert load_config(config(tmp_path, "log_level: debug\n"), ENV).log_level == "debug"
    assert load_config(config(tmp_path, "log_level: debug\n"), {**ENV, "FLEETLLM_LOG_LEVEL": "Error"}).log_level == \
        "error"
    with pytest.raises(ConfigurationError, match="FLEETLLM_LOG_LEVEL: unknown log level 'loud'"):
        load_config(config(tmp_path), {**ENV, "FLEETLLM_LOG_LEVEL": "loud"})
    with pytest.raises(ConfigurationError, match="/log_level"):
        load_config(config(tmp_path, "log_level: loud\n"), ENV)


def test_the_flag_wins() -> None:
    assert resolve_level("warning", {"FLEETLLM_LOG_LEVEL": "debug"}, "error") == logging.WARNING
    assert resolve_level(None, {"FLEETLLM_LOG_LEVEL": "debug"}, "error") == logging.DEBUG
    assert resolve_level(None, {}, "error") == logging.ERROR
    with pytest.raises(ValueError, match="--log-level: unknown log level 'x'"):
        resolve_level("x", {})


def test_every_long_running_command_takes_it(capsys: pytest.CaptureFixture[str]) -> None:
    for command in ("serve", "reconcile", "gateway"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        assert "--log-level LEVEL" in capsys.readouterr().out, command


def test_a_bad_environment_value_is_a_usage_error(monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("FLEETLLM_LOG_LEVEL", "loud")
    assert main(["validate", "/nonexistent"]) == 2
    assert "FLEETLLM_LOG_LEVEL: unknown log level 'loud'" in capsys.readouterr().err


def test_reconcile_takes_the_flag_and_the_environment(tmp_path: Path, fleet_git: Path) -> None:
    """`reconcile --once` against a LiteLLM that is not there: its pass logs an error line, which
    --log-level critical drops and FLEETLLM_LOG_LEVEL=debug keeps."""
    path = tmp_path / "cp.yaml"
    path.write_text(MINIMAL.replace("{path: fleet}", f"{{path: '{fleet_git}'}}").replace(
        'vllm_api_salt: "${env:SALT}"', 'vllm_api_salt: "${env:SALT}", legacy_api_key: "${env:LEGACY}"'))
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LEGACY": "sk-legacy-0123456789", **ENV}
    quiet = subprocess.run([str(FLEETLLM), "reconcile", "--config", str(path), "--once", "--log-level", "critical"],
                           env=env, capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path)
    loud = subprocess.run([str(FLEETLLM), "reconcile", "--config", str(path), "--once"],
                          env={**env, "FLEETLLM_LOG_LEVEL": "debug"}, capture_output=True, text=True, timeout=120,
                          check=False, cwd=tmp_path)
    assert '"level":' not in quiet.stderr, quiet.stderr
    assert '"level":' in loud.stderr, loud.stderr
