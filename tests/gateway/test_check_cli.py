"""Conformance group 9 as processes: `--check`, start-up failures, the CLI entry points, READY=1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleetllm_gateway import native
from fleetllm_installer.zipapp import build_zipapp
from tests.gateway.conftest import GATEWAY_PYTHON, ROOT, GatewayProcess, Upstreams, reference_config, running_gateway
from tests.support.integration import missing

EXAMPLE = Path(__file__).with_name("llmhop_example.json")
SPEC_CANDIDATES = (ROOT.parent / "shared" / "spec" / "llmhop.txt", Path("/work/shared/spec/llmhop.txt"))


def _run(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([GATEWAY_PYTHON, "-m", "fleetllm_gateway", *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}, cwd=cwd or ROOT)


def test_the_spec_example_passes_check_as_written() -> None:
    result = _run("--check", "--config", str(EXAMPLE))
    assert result.returncode == 0, result.stderr
    # On a compiled build (tests/gateway/test_native.py runs the suite so) the verdict says it would run it.
    compiled = "; compiled modules" if os.environ.get(native.ENV) else ""
    assert f"valid (3 models, 3 listed{compiled})" in result.stdout


def test_example_file_is_the_spec_text() -> None:
    spec = next((p for p in SPEC_CANDIDATES if p.exists()), None)
    if spec is None:
        missing("../shared/spec/llmhop.txt is not beside this checkout")
    text = spec.read_text()
    start = text.index("Create a config.json:") + len("Create a config.json:")
    assert text[start:text.index("host defaults to every interface")].strip() == EXAMPLE.read_text().strip()


def test_check_accepts_llmhop_spellings_and_default_path(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(EXAMPLE.read_text())
    assert _run("-check", cwd=tmp_path).returncode == 0
    assert _run("-check", "-config", str(EXAMPLE)).returncode == 0


@pytest.mark.parametrize(("config", "message"), [
    ({"models": {"m": {"url": "localhost:8000"}}},
     'config: models.m: url "localhost:8000" must be an absolute http(s) or unix URL'),
    ({"maxBodyByes": 1, "models": {"m": {"url": "http://x"}}}, 'config: unknown field "maxBodyByes"'),
    ({"authTokens": ["x${}y"], "models": {"m": {"url": "http://x"}}}, "config: authTokens[0]: empty reference ${}"),
    ({"authTokens": ["${}"], "models": {"m": {"url": "http://x"}}}, "config: authTokens[0]: empty reference ${}"),
])
def test_check_rejects_with_the_message(tmp_path: Path, config: dict[str, object], message: str) -> None:
    path = tmp_path / "c.json"
    path.write_text(json.dumps(config))
    result = _run("--check", "--config", str(path))
    assert result.returncode == 1
    assert any(line.startswith(message) for line in result.stderr.splitlines()), result.stderr


def test_missing_config_file(tmp_path: Path) -> None:
    result = _run("--check", "--config", str(tmp_path / "absent.json"))
    assert result.returncode == 1
    assert "No such file or directory" in result.stderr


def test_missing_env_passes_check_but_fails_start(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"host": "127.0.0.1", "port": 1, "authTokens": ["${env:NOPE_NOT_SET}"],
                                "models": {"m": {"url": "http://127.0.0.1:9"}}}))
    assert _run("--check", "--config", str(path)).returncode == 0
    started = _run("--config", str(path))
    assert started.returncode == 1
    (line,) = [json.loads(line) for line in started.stderr.splitlines()]  # serving: the log's JSON line
    assert line["level"] == "error" and line["problem"] == 'config: authTokens[0]: env var "NOPE_NOT_SET" not set'


def test_literal_dollar_token_authenticates(upstreams: Upstreams) -> None:
    with running_gateway(reference_config(upstreams, authTokens=["pa$$word"])) as gateway:
        assert gateway.request("GET", "/v1/models", token="pa$word").status == 200
        assert gateway.request("GET", "/v1/models", token="pa$$word").status == 401


def test_file_and_env_references_at_start(upstreams: Upstreams, tmp_path: Path) -> None:
    (tmp_path / "token").write_text("from-file\n")
    config = reference_config(upstreams, authTokens=[f"${{file:{tmp_path}/token}}", "${env:GW_TEST_TOKEN}"])
    config["models"]["injected"]["headers"]["Authorization"] = "Bearer ${env:GW_TEST_TOKEN}"
    with running_gateway(config, env={"GW_TEST_TOKEN": "from-env"}) as gateway:
        assert gateway.request("GET", "/v1/models", token="from-file").status == 200
        reply = gateway.request("POST", "/v1/x", body=b'{"model":"injected"}', token="from-env")
        assert reply.echo_headers["authorization"] == ["Bearer from-env"]
        assert "from-file" not in gateway.stderr()
        assert "from-env" not in gateway.stderr()


def test_bind_failure_exits_1(upstreams: Upstreams, gw: GatewayProcess, tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text(json.dumps({**reference_config(upstreams), "port": gw.port}))
    result = _run("--config", str(path))
    assert result.returncode == 1
    assert f"listen tcp 127.0.0.1:{gw.port}: " in result.stderr


def test_sigterm_stops_cleanly(upstreams: Upstreams) -> None:
    # running_gateway has already proved READY=1 comes once the port accepts connections.
    with running_gateway(reference_config(upstreams)) as gateway:
        assert gateway.request("GET", "/health", token=None).status == 200
        assert gateway.stop() == 0


def test_fleetllm_gateway_subcommand_and_console_script() -> None:
    result = subprocess.run([sys.executable, "-m", "fleetllm", "gateway", "--check", "--config", str(EXAMPLE)],
                            capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr
    assert "valid (3 models" in result.stdout


def test_box_zipapp_runs_the_gateway(tmp_path: Path) -> None:
    box = tmp_path / "box.pyz"
    build_zipapp(box)
    result = subprocess.run([sys.executable, str(box), "gateway", "--check", "--config", str(EXAMPLE)],
                            capture_output=True, text=True, timeout=60, cwd=tmp_path,
                            env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert result.returncode == 0, result.stderr
    assert "valid (3 models" in result.stdout
