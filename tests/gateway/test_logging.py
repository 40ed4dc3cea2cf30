"""The gateway's log is JSON lines in the one fleetllm format, at the level asked for; `--version` works."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from fleetllm import __version__ as control_plane_version
from tests.gateway.conftest import GATEWAY_PYTHON, ROOT, TOKEN, Upstreams, reference_config, running_gateway

ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def gateway(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([GATEWAY_PYTHON, "-m", "fleetllm_gateway", *args], env=env or ENV, capture_output=True,
                          text=True, timeout=60, check=False, cwd=cwd)


def test_version_exits_0_and_names_the_version() -> None:
    done = gateway("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"fleetllm-gateway {control_plane_version}"


def test_every_line_is_json_with_a_level_and_no_token(upstreams: Upstreams) -> None:
    with running_gateway(reference_config(upstreams)) as gw:
        assert gw.request("POST", "/v1/x", body=b'{"model":"dead"}').status == 502
        gw.raw(b"GET / HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + TOKEN.encode() + b"\r\nBad Header\r\n\r\n")
        assert gw.stop() == 0
        text = gw.stderr()
    lines = [json.loads(line) for line in text.splitlines()]
    assert next(e["event"] for e in lines) == "listening"
    assert {"upstream failed", "refused a malformed request", "stopping"} <= {e["event"] for e in lines}
    for entry in lines:
        assert entry["level"] in ("debug", "info", "warning", "error", "critical")
        assert entry["ts"].endswith("Z") and entry["logger"]
    assert f"Bearer {TOKEN}" not in text


def test_log_level_from_the_environment_drops_info(upstreams: Upstreams) -> None:
    with running_gateway(reference_config(upstreams), env={"FLEETLLM_LOG_LEVEL": "warning"}) as gw:
        assert gw.request("POST", "/v1/x", body=b'{"model":"dead"}').status == 502
        assert gw.stop() == 0
        events = [json.loads(line)["event"] for line in gw.stderr().splitlines()]
    assert events == ["upstream failed"]


def test_a_bad_level_is_a_usage_error(tmp_path: Path) -> None:
    done = gateway("--config", str(tmp_path / "missing.json"), env={**ENV, "FLEETLLM_LOG_LEVEL": "loud"})
    assert done.returncode == 2
    assert "FLEETLLM_LOG_LEVEL: unknown log level 'loud'" in done.stderr
    assert gateway("--log-level", "loud", "--check").returncode == 2  # argparse: not one of the choices


def test_a_config_error_while_serving_is_a_json_line(tmp_path: Path) -> None:
    done = gateway("--config", str(tmp_path / "missing.json"), cwd=tmp_path)
    assert done.returncode == 1
    entries = [json.loads(line) for line in done.stderr.splitlines()]
    assert entries and all(e["level"] == "error" and e["event"] == "invalid configuration" for e in entries)
    checked = gateway("--config", str(tmp_path / "missing.json"), "--check", cwd=tmp_path)  # a person reads this
    assert checked.returncode == 1 and not checked.stderr.startswith("{")


def test_fleetllm_gateway_passes_its_log_level_on(tmp_path: Path) -> None:
    """`fleetllm gateway --log-level critical`: the config error (an error line) is not logged."""
    fleetllm = Path(sys.executable).parent / "fleetllm"
    command = [str(fleetllm), "gateway", "--config", str(tmp_path / "missing.json")]
    quiet = subprocess.run([*command, "--log-level", "critical"], capture_output=True, text=True, timeout=60,
                           check=False, cwd=tmp_path)
    loud = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False, cwd=tmp_path)
    assert quiet.returncode == loud.returncode == 1
    assert quiet.stderr == ""
    assert json.loads(loud.stderr.splitlines()[0])["event"] == "invalid configuration"
