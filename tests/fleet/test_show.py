"""`fleetllm show`: the table is never cut when piped; `--format json` has the documented shape."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleetllm.cli.main import main
from tests.boxgateway.fleets import EXAMPLE_GATEWAY_BOX, example_with_gateway
from tests.conftest import EXAMPLE

FLEETLLM = Path(sys.executable).parent / "fleetllm"


def test_piped_table_keeps_every_name_whole() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    done = subprocess.run([str(FLEETLLM), "show", str(EXAMPLE)], env=env, capture_output=True, text=True,
                          timeout=60, check=True)
    rows = done.stdout.splitlines()
    assert max(map(len, rows)) > 80  # the table is wider than a default terminal...
    for name in ("meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen2.5-Coder-7B-Instruct", "google/gemma-3-27b-it",
                 "qwen2.5-coder-7b", "k7v2m9x4q1w8e3"):
        assert any(name in row for row in rows), name  # ...and no name is cut or wrapped


def test_json_has_the_documented_shape(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["show", str(example_with_gateway(tmp_path / "fleet")), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) == {"format", "revision", "boxes"}
    assert doc["format"] == 1 and isinstance(doc["revision"], str)
    for box in doc["boxes"]:
        assert set(box) == {"name", "provider", "gateway_port", "servers"}
        for server in box["servers"]:
            assert set(server) == {"name", "model", "weights", "port", "max_model_len", "vram_gb"}
            assert isinstance(server["port"], int)
    by_name = {b["name"]: b for b in doc["boxes"]}
    assert list(by_name) == ["203.0.113.10", "203.0.113.24", "k7v2m9x4q1w8e3", "198.51.100.23"]
    assert by_name[EXAMPLE_GATEWAY_BOX]["gateway_port"] == 8003
    assert by_name["k7v2m9x4q1w8e3"]["provider"] == "runpod"
    assert by_name["203.0.113.10"]["servers"][1] == {
        "name": "llama3.1-8b", "model": "llama3.1-8b", "weights": "meta-llama/Llama-3.1-8B-Instruct", "port": 8002,
        "max_model_len": 32768, "vram_gb": 16.0}


def test_a_short_form_box_shows_as_static() -> None:
    """203.0.113.10 is written in the short form (`- [model, port]` rows), which means provider: static."""
    done = subprocess.run([str(FLEETLLM), "show", str(EXAMPLE)], capture_output=True, text=True, timeout=60,
                          check=True)
    providers = {}
    for row in done.stdout.splitlines():
        cells = [c.strip() for c in row.split("│")[1:-1]]
        if len(cells) > 2 and cells[0] and cells[0] != "box":
            providers[cells[0]] = cells[1]
    assert providers == {"203.0.113.10": "static", "203.0.113.24": "vast", "k7v2m9x4q1w8e3": "runpod",
                         "198.51.100.23": "static"}
