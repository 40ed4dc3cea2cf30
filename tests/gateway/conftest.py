"""The conformance suite's harness: fixture upstreams, and the real gateway as a child process.

The gateway is started as `python -m fleetllm_gateway --config FILE` with $NOTIFY_SOCKET pointing at a
datagram socket of the test, so start-up waits for its READY=1 (and proves it comes only once the
port accepts connections). Ports are ephemeral, sockets live in fresh temp directories, and every
process is stopped at teardown.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from fleetllm.demo.procs import free_port as free_port  # re-exported for this package's tests
from fleetllm_gateway import native
from tests.gateway.upstreams import Running, start_tcp_echo, start_unix_echo

ROOT = Path(__file__).resolve().parents[2]
# The interpreter that runs the gateway; point it at another one (say a vLLM image's Python with its
# httptools) to run the suite against that.
GATEWAY_PYTHON = os.environ.get("FLEETLLM_GATEWAY_PYTHON", sys.executable)
TOKEN = "tok"
READY_TIMEOUT = 30.0


@dataclass
class Upstreams:
    tcp_port: int
    socket_path: str
    dead_port: int
    servers: list[Running] = field(default_factory=list)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.tcp_port}/base?backend=1"


@pytest.fixture(scope="session")
def upstreams() -> Iterator[Upstreams]:
    directory = tempfile.mkdtemp(prefix="gw-up-")  # short: unix socket paths are limited to 107 bytes
    tcp, port = start_tcp_echo()
    socket_path = os.path.join(directory, "echo.sock")
    unix = start_unix_echo(socket_path)
    # Bound but never listening: connections are refused, and no other process can take the port.
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    try:
        yield Upstreams(port, socket_path, dead.getsockname()[1], [tcp, unix])
    finally:
        dead.close()
        tcp.stop()
        unix.stop()
        shutil.rmtree(directory, ignore_errors=True)


def reference_config(up: Upstreams, **overrides: Any) -> dict[str, Any]:
    """The fixture of llmhop.md §12: token `tok`, 1 KiB body cap, 2 concurrent requests."""
    config: dict[str, Any] = {
        "host": "127.0.0.1",
        "authTokens": [TOKEN],
        "maxBodyBytes": 1024,
        "maxConcurrentRequests": 2,
        "maxQueuedRequests": 0,  # LLMhop: no queue, immediate 503
        "models": {
            "echo": {"url": up.base_url},
            "Qwen/Qwen3-8B": {"url": up.base_url},
            "sock": {"url": f"unix://{up.socket_path}"},
            "hidden": {"url": up.base_url, "unlisted": True},
            "injected": {"url": up.base_url, "headers": {
                "Authorization": "Bearer upstream-key", "X-Injected": "yes", "Host": "injected.example"}},
            "dead": {"url": f"http://127.0.0.1:{up.dead_port}"},
        },
    }
    config.update(overrides)
    return config


@dataclass
class Reply:
    status: int
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k.lower() == name.lower()), None)

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def echo_headers(self) -> dict[str, list[str]]:
        """Headers the echo upstream received, by lower-case name."""
        received: dict[str, list[str]] = {}
        for name, value in self.json()["headers"]:
            received.setdefault(name.lower(), []).append(value)
        return received


class GatewayProcess:
    def __init__(self, config: dict[str, Any], directory: Path, env: dict[str, str] | None = None,
                 args: tuple[str, ...] = ()) -> None:
        self.args = args
        self.config_path = directory / "gateway.json"
        self.directory = directory
        self.config = config
        self.env = env or {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.stderr_path = directory / "gateway.stderr"

    def start(self) -> GatewayProcess:
        for _attempt in range(5):  # a port picked free may be taken before the gateway binds it
            self.port = free_port()
            self.config_path.write_text(json.dumps({**self.config, "port": self.port}))
            if self._start_once():
                return self
        raise AssertionError(f"gateway did not start: {self.stderr()}")

    def _start_once(self) -> bool:
        notify_path = str(self.directory / "notify.sock")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(notify_path)
        notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        notify.bind(notify_path)
        env = {**os.environ, "PYTHONPATH": str(ROOT), "NOTIFY_SOCKET": notify_path, **self.env}
        with open(self.stderr_path, "wb") as stderr:
            self.proc = subprocess.Popen([GATEWAY_PYTHON, "-m", "fleetllm_gateway", "--config", str(self.config_path),
                                          *self.args],
                                         env=env, stdout=subprocess.DEVNULL, stderr=stderr, cwd=self.directory)
        try:
            while True:
                readable, _, _ = select.select([notify], [], [], 0.1)
                if readable:
                    message = notify.recv(4096).decode()
                    assert message == "READY=1", message
                    # READY=1 means the listener is bound: a connection succeeds at once.
                    socket.create_connection(("127.0.0.1", self.port), timeout=2).close()
                    if os.environ.get(native.ENV) and '"event":"listening"' in self.stderr():
                        # The suite on a compiled build (tests/gateway/test_native.py): so is every gateway.
                        assert '"compiled":true' in self.stderr(), self.stderr()
                    return True
                if self.proc.poll() is not None:
                    if "address already in use" in self.stderr().lower():
                        return False
                    raise AssertionError(f"gateway exited with {self.proc.returncode}: {self.stderr()}")
        finally:
            notify.close()

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace") if self.stderr_path.exists() else ""

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def request(self, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None,
                token: str | None = TOKEN, timeout: float = 20.0) -> Reply:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            sent = dict(headers or {})
            if token is not None:
                sent.setdefault("Authorization", f"Bearer {token}")
            conn.request(method, path, body=body, headers=sent)
            response = conn.getresponse()
            return Reply(response.status, response.getheaders(), response.read())
        finally:
            conn.close()

    def wait_in_flight(self, model: str, count: int, timeout: float = 60.0) -> None:
        """Poll /metrics until `model` holds `count` slots."""
        line = f'fleetllm_gateway_requests_in_flight{{model="{model}"}} {count}'
        deadline = time.monotonic() + timeout
        while line not in self.request("GET", "/metrics").body.decode():
            if time.monotonic() > deadline:
                raise AssertionError(f"{model} never had {count} requests in flight")
            time.sleep(0.01)

    def raw(self, data: bytes, timeout: float = 20.0) -> bytes:
        """Send raw bytes (which should ask for `Connection: close`) and read until the gateway closes."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as sock:
            sock.sendall(data)
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks)


@contextlib.contextmanager
def running_gateway(config: dict[str, Any], env: dict[str, str] | None = None,
                    args: tuple[str, ...] = ()) -> Iterator[GatewayProcess]:
    directory = Path(tempfile.mkdtemp(prefix="gw-"))
    process = GatewayProcess(config, directory, env, args)
    try:
        yield process.start()
    finally:
        process.stop()
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="module")
def gw(upstreams: Upstreams) -> Iterator[GatewayProcess]:
    """One gateway with the reference fixture config, shared by a test module."""
    with running_gateway(reference_config(upstreams)) as process:
        yield process


def pytest_sessionstart(session: pytest.Session) -> None:
    """The suite on a compiled build (tests/gateway/test_native.py) stops at once when the build is not
    in use: passing on the Python modules would prove nothing about it."""
    if os.environ.get(native.ENV) and not native.STATUS.compiled:
        pytest.exit(f"{native.ENV} is set but its build is not used: {native.STATUS.reason}", returncode=3)
