"""The launcher: waits for the earlier servers on its card, then becomes the command."""

from __future__ import annotations

import json
import logging
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetllm_contract.logfmt import JsonLineFormatter
from fleetllm_installer import launcher
from tests.installer.conftest import STUB_VLLM, free_port
from tests.installer.realprocs import http_status, wait_until


@pytest.fixture
def stub_port() -> Iterator[int]:
    port = free_port()
    process = subprocess.Popen([sys.executable, str(STUB_VLLM), "serve", "m", "--host", "127.0.0.1",
                                "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until("stub health", lambda: http_status(f"http://127.0.0.1:{port}/health") == 200)
        yield port
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)


def test_wait_returns_once_every_earlier_server_is_healthy(stub_port: int) -> None:
    assert launcher.wait_for([("a", stub_port), ("b", stub_port)], "127.0.0.1", timeout_s=30, poll_s=0.05)


def test_wait_gives_up_at_the_timeout(capsys: pytest.CaptureFixture[str]) -> None:
    assert not launcher.wait_for([("gone", free_port())], "127.0.0.1", timeout_s=0.2, poll_s=0.05)
    assert "gave up waiting after 0.2 s for gone (port" in capsys.readouterr().out


def test_launcher_execs_the_command_and_passes_the_environment_on(stub_port: int, tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, launcher.__file__, "--name", "x", "--after", f"a={stub_port}",
                           "--", "/bin/sh", "-c", f'echo "$SECRET_FOR_TEST" > {out}'],
                          env={"SECRET_FOR_TEST": "kept", "PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert out.read_text() == "kept\n"
    assert "x: a healthy" in done.stdout
    assert "kept" not in done.stdout


def test_missing_command_exits_127(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, launcher.__file__, "--name", "x", "--", str(tmp_path / "nope")],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 127
    assert "cannot run" in done.stdout


@pytest.mark.parametrize("bad", ["noport", "a=", "=1", "a=b"])
def test_bad_after_is_a_usage_error(bad: str) -> None:
    with pytest.raises(SystemExit) as caught:
        launcher.main(["--name", "x", "--after", bad, "--", "true"])
    assert caught.value.code == 2


def test_its_lines_are_the_fleetllm_log_format(capsys: pytest.CaptureFixture[str]) -> None:
    """fleetllm-launch stands alone on the box, so it writes the format itself: the same keys, parsed
    back by the contract's own formatter's rules."""
    launcher.log("x: starting vllm serve m", "warning")
    line = json.loads(capsys.readouterr().out)
    record = logging.LogRecord("fleetllm.launch", logging.WARNING, __file__, 1, "x: starting vllm serve m", None, None)
    expected = json.loads(JsonLineFormatter().format(record))
    assert list(line) == list(expected)
    assert {k: v for k, v in line.items() if k != "ts"} == {k: v for k, v in expected.items() if k != "ts"}
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", line["ts"])
