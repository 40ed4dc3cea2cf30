"""`fleetllm serve` under systemd's Type=notify: READY=1 over a real unix datagram socket once the port
accepts connections, STOPPING=1 when SIGTERM starts the drain (fleetllm_contract.sdnotify)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetllm.demo.procs import free_port, stop
from fleetllm_contract.sdnotify import notify_address, sd_notify
from tests.server.conftest import ENV, base_config, write_config


@pytest.fixture
def notify_socket() -> Iterator[tuple[socket.socket, str]]:
    """A bound AF_UNIX datagram socket, as systemd's; in a short directory (sun_path holds 107 bytes)."""
    directory = tempfile.mkdtemp(prefix="fleetllm-notify-")
    path = os.path.join(directory, "notify")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    try:
        yield sock, path
    finally:
        sock.close()
        os.unlink(path)
        os.rmdir(directory)


def start_serve(tmp_path: Path, fleet_git: Path, notify: str) -> tuple[subprocess.Popen[bytes], int, Path]:
    config = write_config(tmp_path / "cp.yaml", base_config(fleet_git, tmp_path / "state.db"))
    port = free_port()
    log = tmp_path / "serve.log"
    with log.open("w") as out:
        process = subprocess.Popen([sys.executable, "-m", "fleetllm", "serve", "--config", str(config), "--listen",
                                    f"127.0.0.1:{port}"], stdout=out, stderr=subprocess.STDOUT,
                                   env={**os.environ, **ENV, "NOTIFY_SOCKET": notify}, start_new_session=True)
    return process, port, log


def receive(sock: socket.socket, process: subprocess.Popen[bytes], log: Path) -> str:
    sock.settimeout(90)
    try:
        return sock.recv(4096).decode()
    except TimeoutError:
        stop(process, timeout_s=10)
        raise AssertionError(f"no notification; serve's log:\n{log.read_text()}") from None


def test_ready_only_once_the_port_accepts_and_stopping_on_sigterm(
        tmp_path: Path, fleet_git: Path, notify_socket: tuple[socket.socket, str]) -> None:
    sock, path = notify_socket
    process, port, log = start_serve(tmp_path, fleet_git, path)
    try:
        assert receive(sock, process, log) == "READY=1"
        # At once, with no retry: had READY=1 been sent before the listen, this would be refused.
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as response:
            assert response.status == 200
        os.killpg(process.pid, signal.SIGTERM)
        assert receive(sock, process, log) == "STOPPING=1"
        assert process.wait(timeout=30) == 0
    finally:
        stop(process, timeout_s=10)


def test_an_unreachable_notify_socket_is_logged_and_serving_goes_on(tmp_path: Path, fleet_git: Path) -> None:
    process, port, log = start_serve(tmp_path, fleet_git, str(tmp_path / "nobody-listens"))
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
                    assert response.status == 200
                    break
            except OSError:
                assert process.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)
    finally:
        stop(process, timeout_s=15)
    events = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    failed = [e for e in events if e["event"] == "sd_notify failed"]
    assert failed and failed[0]["state"] == "READY=1" and failed[0]["level"] == "warning"


def test_sd_notify_without_a_socket_sends_nothing() -> None:
    assert notify_address({}) is None
    assert sd_notify("READY=1", {}) is False


def test_sd_notify_to_the_abstract_namespace() -> None:
    name = f"fleetllm-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(5)
        assert notify_address({"NOTIFY_SOCKET": "@" + name}) == "\0" + name
        assert sd_notify("READY=1\nSTATUS=serving", {"NOTIFY_SOCKET": "@" + name}) is True
        assert sock.recv(4096) == b"READY=1\nSTATUS=serving"
