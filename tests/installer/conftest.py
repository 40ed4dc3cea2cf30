"""Fixtures for the installer: a small fleet rendered by the real renderer, a control plane that follows
the contract's status codes, the stub vLLM and a fake nvidia-smi on PATH, and the installer's
environment pointed at temp dirs."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from fleetllm.adapters.git import read_directory
from fleetllm.core.fleet.bearer import Salt
from fleetllm.core.fleet.render import Bearers, render_box
from fleetllm.core.fleet.validate import validate_snapshot
from fleetllm.demo.procs import free_port as free_port  # re-exported for this package's tests
from fleetllm_contract.gatewaynative import PATH_PREFIX, SHA256_HEADER
from tests.conftest import TEST_SALT
from tests.installer.realprocs import (
    SUPERVISORD,
    Supervisor,
    pid_alive,
    pids_mentioning,
    wait_until,
    write_supervisord_conf,
)
from tests.support.ports import free_ports

SUPPORT = Path(__file__).resolve().parent.parent / "support"
STUB_VLLM = SUPPORT / "stub_vllm.py"
FAKE_NVIDIA_SMI = SUPPORT / "fake_nvidia_smi.py"
FLEET_KEY = "fleet-key-for-tests-0001"
BOX = "box-a"

# Every variable the installer reads, so a developer's environment cannot leak into a test.
INSTALLER_VARS = [
    "LLMAO_HOST", "FLEETLLM_URL", "ASFQUART_URL", "FLEETLLM_FLEET_KEY", "FLEET_KEY", "FLEETLLM_CA_BUNDLE",
    "FLEETLLM_DATA_DIR", "DATA_DIRECTORY", "FLEETLLM_SUPERVISOR_CONF_DIR", "SUPERVISOR_CONF_DIR",
    "FLEETLLM_SUPERVISOR_CONFIG", "FLEETLLM_VLLM_BIN", "VLLM_BIN", "FLEETLLM_HF_HOME", "FLEETLLM_LISTEN_HOST",
    "FLEETLLM_START_TIMEOUT_S", "FLEETLLM_STARTSECS", "FLEETLLM_FETCH_DEADLINE_S", "FLEETLLM_GATEWAY_PYTHON",
]


MODELS = """\
models:
  small:
    vllm:
      model: org/small-model
      max_model_len: 4096
      vram_gb: 10
      disk_gb: 5
      args: ["--enable-prefix-caching", "--limit-mm-per-prompt", '{"image": 4}']
  large:
    vllm:
      model: org/large-model
      max_model_len: 8192
      vram_gb: 30
      disk_gb: 20
      settings:
        kv-cache-dtype: fp8
"""


def write_fleet(directory: Path, ports: list[int], rows: list[tuple[str, int, str | None]],
                gateway: int | None = None, rollout: str = "manual") -> Path:
    """A fleet repository with one box, BOX, whose rows are (model, port, name-or-None), and a box gateway
    on `gateway` (one of `ports`) when given. `rollout: manual` by default: the box JSON is the contract's
    (no `agent`), which is what the installer's own tests are about; the agent's tests add `agent`."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "fleet.yaml").write_text(
        f"version: 1\nfleet_id: test-fleet\nlisten_ports: [{', '.join(map(str, ports))}]\nmax_servers_per_box: {max(len(ports), len(rows))}\n"
        f"rollout: {{mode: {rollout}}}\n")
    (directory / "models.yaml").write_text(MODELS)
    lines = ["hosts:", f"  {BOX}:"]
    indent = "    "
    if gateway is not None:
        lines += [f"    gateway: {gateway}", "    servers:"]
        indent = "      "
    for model, port, name in rows:
        lines.append(f"{indent}- [{model}, {port}" + (f", {name}]" if name else "]"))
    (directory / "placement.yaml").write_text("\n".join(lines) + "\n")
    return directory


def render(directory: Path, box: str = BOX) -> dict[str, Any]:
    validation = validate_snapshot(read_directory(directory))
    assert validation.fleet is not None, validation.diagnostics
    return render_box(validation.fleet, box, Bearers(Salt(TEST_SALT)))


@dataclass
class FakeControlPlane:
    """GET /vllm/config and POST /vllm/report by the contract: 403 for a missing or wrong fleet key, the
    X-LLMAO-Host header as the only key, 404 for an unknown box, 200 with the box JSON. `script` forces
    statuses for the next config fetches (e.g. [503, 503]); `report_status` forces the report's.
    GET /vllm/gateway-native/<tag> answers `natives[tag]` (200, 304 to its ETag, 404 without one)."""

    boxes: dict[str, Any]
    script: list[int] = field(default_factory=list)
    report_status: int = 200
    raw_config: bytes | None = None
    redirect_to: str = ""
    installer: bytes | None = None  # GET /vllm/installer, with its X-Installer-SHA256
    natives: dict[str, bytes] = field(default_factory=dict)  # GET /vllm/gateway-native/<tag>: its archive
    native_etags: dict[str, str] = field(default_factory=dict)  # an ETag other than the archive's sha256
    port: int = 0
    requests: list[dict[str, Any]] = field(default_factory=list)
    reports: list[dict[str, Any]] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None

    tls: ssl.SSLContext | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        scheme = "https" if self.tls else "http"
        return f"{scheme}://127.0.0.1:{self.server.server_address[1]}"

    def handler(self) -> type[BaseHTTPRequestHandler]:
        plane = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def answer(self, status: int, document: Any, raw: bytes | None = None,
                       headers: dict[str, str] | None = None) -> None:
                body = raw if raw is not None else json.dumps(document).encode()
                self.send_response(status)
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def box(self) -> tuple[int, str | None]:
                plane.requests.append({"method": self.command, "path": self.path,
                                       "headers": {k.lower(): v for k, v in self.headers.items()}})
                if self.headers.get("Authorization") != f"Bearer {FLEET_KEY}":
                    return 403, None
                host = self.headers.get("X-LLMAO-Host") or self.client_address[0]
                return (200, host) if host in plane.boxes else (404, None)

            def do_GET(self) -> None:
                status, host = self.box()
                if self.path == "/vllm/installer" and status != 403 and plane.installer is not None:
                    digest = hashlib.sha256(plane.installer).hexdigest()
                    self.answer(200, None, plane.installer, headers={"X-Installer-SHA256": digest})
                elif self.path.startswith(PATH_PREFIX) and status != 403:
                    self.gateway_native(self.path.removeprefix(PATH_PREFIX))
                elif self.path != "/vllm/config":
                    self.answer(404, {"error": "not found"})
                elif plane.script:
                    forced = plane.script.pop(0)
                    if forced in (301, 302, 307):
                        self.send_response(forced)
                        self.send_header("Location", plane.redirect_to)
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    self.answer(forced, {"error": "scripted"},
                                headers={"Retry-After": "7"} if forced == 429 else None)
                elif status != 200:
                    self.answer(status, {"error": "forbidden" if status == 403 else "unknown host"})
                elif plane.raw_config is not None:
                    self.answer(200, None, plane.raw_config)
                else:
                    self.answer(200, plane.boxes[str(host)])

            def gateway_native(self, tag: str) -> None:
                archive = plane.natives.get(tag)
                if archive is None:
                    self.answer(404, {"error": f"no compiled gateway for {tag}"})
                    return
                etag = plane.native_etags.get(tag) or f'"{hashlib.sha256(archive).hexdigest()}"'
                if etag in [e.strip() for e in (self.headers.get("If-None-Match") or "").split(",")]:
                    plane.requests[-1]["status"] = 304
                    self.send_response(304)
                    self.send_header("ETag", etag)
                    self.end_headers()
                    return
                self.answer(200, None, archive, headers={"ETag": etag, SHA256_HEADER: etag.strip('"')})

            def do_POST(self) -> None:
                status, _ = self.box()
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"null")
                if self.path != "/vllm/report" or status != 200:
                    self.answer(status if status != 200 else 404, {"error": "refused"})
                    return
                plane.reports.append(body)
                if plane.report_status != 200:
                    self.answer(plane.report_status, {"error": "scripted"})
                else:
                    self.answer(200, {"status": "recorded"})

        return Handler

    def start(self) -> FakeControlPlane:
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), self.handler())
        if self.tls is not None:
            self.server.socket = self.tls.wrap_socket(self.server.socket, server_side=True)
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


@pytest.fixture
def ports() -> list[int]:
    return free_ports("127.0.0.1", "127.0.0.1", "127.0.0.1")


@pytest.fixture
def fleet_repo(tmp_path: Path, ports: list[int]) -> Path:
    return write_fleet(tmp_path / "fleet", ports, [("small", ports[0], None), ("large", ports[1], None)])


@pytest.fixture
def box_json(fleet_repo: Path) -> dict[str, Any]:
    return render(fleet_repo)


@pytest.fixture
def control_plane(box_json: dict[str, Any]) -> Iterator[FakeControlPlane]:
    plane = FakeControlPlane({BOX: box_json}).start()
    yield plane
    plane.stop()


@pytest.fixture
def tool_bin(tmp_path: Path) -> Path:
    """A bin dir with `vllm` (the stub) and `nvidia-smi` (the fake)."""
    directory = tmp_path / "bin"
    directory.mkdir()
    (directory / "vllm").symlink_to(STUB_VLLM)
    (directory / "nvidia-smi").symlink_to(FAKE_NVIDIA_SMI)
    return directory


@pytest.fixture
def box_env(tmp_path: Path, tool_bin: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The installer's environment, everything under tmp_path. Returns the data dir."""
    for name in INSTALLER_VARS:
        monkeypatch.delenv(name, raising=False)
    data = tmp_path / "data"
    monkeypatch.setenv("FLEETLLM_DATA_DIR", str(data))
    monkeypatch.setenv("FLEETLLM_SUPERVISOR_CONF_DIR", str(tmp_path / "conf.d"))
    monkeypatch.setenv("FLEETLLM_LISTEN_HOST", "127.0.0.1")
    monkeypatch.setenv("LLMAO_HOST", BOX)
    monkeypatch.setenv("FLEETLLM_FLEET_KEY", FLEET_KEY)
    monkeypatch.setenv("FLEETLLM_FETCH_DEADLINE_S", "0")
    monkeypatch.setenv("PATH", os.pathsep.join([str(tool_bin), str(Path(sys.executable).parent), "/usr/bin", "/bin"]))
    monkeypatch.setenv("FAKE_NVIDIA_SMI_GPUS", "NVIDIA H100 80GB HBM3:81559:81080")
    monkeypatch.delenv("FAKE_NVIDIA_SMI_EXIT", raising=False)
    return data


@pytest.fixture
def supervisor(box_env: Path, tool_bin: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Supervisor]:
    """A real supervisord in tmp_path with its own socket, the stub vLLM (1.5 s load) as `vllm`."""
    short = Path(tempfile.mkdtemp(prefix="llmf-sv-", dir="/tmp"))  # unix socket paths are limited to ~100 bytes
    conf_dir = tmp_path / "conf.d"
    conf_dir.mkdir()
    config = write_supervisord_conf(tmp_path, short, conf_dir)
    events = tmp_path / "stub-events.jsonl"
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "STUB_VLLM_LOAD_S": "1.5",
           "STUB_VLLM_EVENTS": str(events)}
    process = subprocess.Popen([str(SUPERVISORD), "-n", "-c", str(config)], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    sv = Supervisor(config, process, events)
    monkeypatch.setenv("FLEETLLM_SUPERVISOR_CONFIG", str(config))
    monkeypatch.setenv("FLEETLLM_STARTSECS", "1")
    monkeypatch.setenv("FLEETLLM_START_TIMEOUT_S", "60")
    wait_until("supervisord's socket", lambda: (short / "supervisor.sock").exists(), 30)
    try:
        yield sv
    finally:
        process.send_signal(signal.SIGTERM)  # supervisord stops its programs (stopasgroup) on the way out
        try:
            process.wait(timeout=90)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        for event in sv.read_events():
            if event["event"] == "start" and pid_alive(event["pid"]):
                os.kill(event["pid"], signal.SIGKILL)
        for pid in pids_mentioning(f"{tmp_path}/"):  # e.g. a box gateway run from this test's data dir
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(short, ignore_errors=True)
