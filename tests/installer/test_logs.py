"""The installer's log: JSON lines in the one fleetllm format unless a person asks for text; its level
from --log-level or FLEETLLM_LOG_LEVEL. (Run under Supervisor or a provisioning script, stderr is a file.)"""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path
from typing import Any

import pytest

from fleetllm_installer import logs
from fleetllm_installer.main import main
from tests.installer.conftest import FakeControlPlane


@pytest.fixture
def env(box_env: Path, control_plane: FakeControlPlane, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FLEETLLM_URL", control_plane.url)
    return box_env


def entries(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines()]


def test_an_install_logs_json_lines_with_levels_and_no_bearer(env: Path, box_json: dict[str, Any],
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--handover", "none"]) == 0
    err = capsys.readouterr().err
    lines = entries(err)
    assert [e["event"] for e in lines][-1] == "2 server(s) handed to supervisord (none)"
    assert all(e["level"] == "info" and e["logger"] == "fleetllm.installer" and e["ts"].endswith("Z") for e in lines)
    for server in box_json["servers"]:
        assert server["api_key"] not in err


def test_a_failure_is_an_error_line(box_env: Path, monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("LLMAO_HOST")
    assert main(["--handover", "none"]) == 2
    (line,) = entries(capsys.readouterr().err)
    assert line["level"] == "error" and "LLMAO_HOST is not set" in line["event"]


def test_text_for_a_person_and_the_level_from_the_flag(env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--handover", "none", "--log-format", "text"]) == 0
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == "fleetllm-installer: 2 server(s) handed to supervisord (none)"
    assert main(["--handover", "none", "--log-level", "warning"]) == 0
    assert capsys.readouterr().err == ""


def test_the_level_from_the_environment(env: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("FLEETLLM_LOG_LEVEL", "ERROR")
    assert main(["--handover", "none"]) == 0
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("FLEETLLM_LOG_LEVEL", "chatty")
    assert main(["--handover", "none"]) == 2
    assert "FLEETLLM_LOG_LEVEL: unknown log level 'chatty'" in capsys.readouterr().err


def test_the_entry_point_is_reusable_by_another_command() -> None:
    """What the box agent does: its own parser, the same switches, its own logger and prog."""
    parser = argparse.ArgumentParser(prog="fleetllm-agent")
    logs.add_arguments(parser)
    stream = io.StringIO()
    logs.setup(parser.parse_args(["--log-level", "debug"]), "fleetllm-agent", "fleetllm.agent", stream)
    logs.log("polled", logger="fleetllm.agent", revision="abc")
    (line,) = entries(stream.getvalue())
    assert {k: line[k] for k in ("level", "logger", "event", "revision")} == {
        "level": "info", "logger": "fleetllm.agent", "event": "polled", "revision": "abc"}
    text = io.StringIO()
    logs.setup(parser.parse_args(["--log-format", "text"]), "fleetllm-agent", "fleetllm.agent", text)
    logs.log("polled", logger="fleetllm.agent", revision="abc")
    assert text.getvalue() == "fleetllm-agent: polled (revision=abc)\n"


def test_the_agent_logs_the_one_format_too(tmp_path: Path) -> None:
    """The box agent (a Supervisor program) configures the same logger as the installer: its lines are
    JSON with a level, info lines included (an unconfigured logger would drop them)."""
    import os
    import subprocess
    import sys

    env = {"PATH": os.environ.get("PATH", ""), "FLEETLLM_DATA_DIR": str(tmp_path), "PYTHONPATH": os.pathsep.join(
        str(Path(__file__).resolve().parents[2] / d) for d in ("contract", "installer", "reconciler", "gateway"))}
    done = subprocess.run([sys.executable, "-m", "fleetllm_installer", "agent", "--once"], env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2, done.stderr
    lines = [json.loads(line) for line in done.stderr.splitlines()]
    assert lines, "the agent said nothing"
    assert {line["level"] for line in lines} <= {"debug", "info", "warning", "error"}
    assert lines[-1]["event"].startswith("agent: "), lines
