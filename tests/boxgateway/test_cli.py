"""`fleetllm render` and `fleetllm show` on a fleet with a gateway box."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleetllm.cli.main import main
from tests.boxgateway.fleets import EXAMPLE_GATEWAY_BOX, example_with_gateway
from tests.conftest import TEST_LEGACY_KEY, TEST_SALT


def test_render_prints_the_gateway(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    repo = example_with_gateway(tmp_path / "fleet")
    monkeypatch.setenv("FLEETLLM_VLLM_API_SALT", TEST_SALT)
    monkeypatch.setenv("FLEETLLM_LEGACY_API_KEY", TEST_LEGACY_KEY)
    assert main(["render", EXAMPLE_GATEWAY_BOX, "--repo", str(repo)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["gateway"]["port"] == 8003
    assert {s["listen_host"] for s in doc["servers"]} == {"127.0.0.1"}


def test_show_marks_servers_behind_a_gateway(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["show", str(example_with_gateway(tmp_path / "fleet"))]) == 0
    out = capsys.readouterr().out
    assert "8002 (gateway :8003)" in out
    assert "(gateway" not in next(line for line in out.splitlines() if "gemma3-27b" in line)
