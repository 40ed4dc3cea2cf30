"""The box agent end to end: a fleet in a real git repository, `fleetllm serve` as a real process, vast.sh
provisioning a box with a real supervisord and the stub vLLM, and the agent the installer left running
under that supervisord. Commits are picked up with no manual step: a revision-only commit restarts
nothing; a commit that adds a server, changes one server's args and removes one restarts only the
changed program; an unchanged config is a 304; dropping `agent` removes the agent and nothing else.

Until the control plane renders `agent` (issue 14, the rollout part), a loopback proxy in front of the
real control plane adds `"agent": {"poll_s": 5}` to the box JSON it serves (and a suffix to its ETag,
so a switch of the proxy's mode is a new ETag); everything else passes through untouched, the
reports land in the real control plane's state store.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from fleetllm_installer import __version__
from tests.conftest import ROOT, TEST_SALT, git
from tests.installer.conftest import BOX, FLEET_KEY, free_port
from tests.installer.realprocs import Supervisor, http_status, pid_alive, wait_until
from tests.support.ports import free_ports
from tests.support.serve import require_serve

FLEETLLM = Path(sys.executable).parent / "fleetllm"
VIEWER_TOKEN = "viewer-token-for-tests-0001"
POLL_S = 5
SUFFIX = "-agent"

pytestmark = [pytest.mark.slow, pytest.mark.integration]

MODELS = """\
models:
  alpha:
    vllm: {{model: org/alpha, max_model_len: 4096, vram_gb: 5, disk_gb: 1, gpu_memory_utilization: 0.2}}
  beta:
    vllm: {{model: org/beta, max_model_len: 4096, vram_gb: 5, disk_gb: 1, gpu_memory_utilization: 0.2,
           args: {beta_args}}}
  gamma:
    vllm: {{model: org/gamma, max_model_len: 4096, vram_gb: 5, disk_gb: 1, gpu_memory_utilization: 0.2}}
"""


def write_fleet(directory: Path, ports: list[int], rows: list[str], beta_args: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "fleet.yaml").write_text(
        f"version: 1\nfleet_id: test-fleet\nlisten_ports: [{', '.join(map(str, ports))}]\nmax_servers_per_box: {len(ports)}\n"
        "rollout: {mode: manual}\n")  # the proxy below decides whether the box JSON asks for the agent
    (directory / "models.yaml").write_text(MODELS.format(beta_args=beta_args))
    (directory / "placement.yaml").write_text("hosts:\n  " + BOX + ":\n" + "".join(f"    - {r}\n" for r in rows))


@dataclass
class Proxy:
    """Forwards every request to the control plane; adds `agent` to 200 answers of GET /vllm/config."""

    upstream: int
    inject: bool = True
    log: list[dict[str, Any]] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> Proxy:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                tag = headers.pop("If-None-Match", None)
                if tag is not None and tag.endswith(SUFFIX + '"') == proxy.inject:
                    headers["If-None-Match"] = tag.replace(SUFFIX + '"', '"')
                connection = http.client.HTTPConnection("127.0.0.1", proxy.upstream, timeout=60)
                connection.request(self.command, self.path, body=body, headers=headers)
                answer = connection.getresponse()
                data = answer.read()
                etag = answer.getheader("ETag")
                if self.path == "/vllm/config" and answer.status == 200 and proxy.inject:
                    data = json.dumps({**json.loads(data), "agent": {"poll_s": POLL_S}}).encode()
                if etag and proxy.inject:
                    etag = etag[:-1] + SUFFIX + '"'
                proxy.log.append({"method": self.command, "path": self.path, "status": answer.status, "bytes": len(data),
                                  "agent_header": self.headers.get("User-Agent", ""),
                                  "report": json.loads(body) if body and self.path == "/vllm/report" else None})
                self.send_response(answer.status)
                for name, value in answer.getheaders():
                    if name.lower() not in ("content-length", "transfer-encoding", "connection", "etag"):
                        self.send_header(name, value)
                if etag:
                    self.send_header("ETag", etag)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                connection.close()

            def do_GET(self) -> None:
                self.forward()

            def do_POST(self) -> None:
                self.forward()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    def agent_gets(self) -> list[int]:
        return [e["status"] for e in self.log if e["path"] == "/vllm/config" and
                e["agent_header"].startswith("fleetllm-agent/")]

    def reports(self) -> list[dict[str, Any]]:
        return [e["report"] for e in self.log if e["report"] is not None]


@pytest.fixture(autouse=True, scope="module")
def serve_works() -> None:
    require_serve()


@pytest.fixture
def agent_ports() -> list[int]:
    return free_ports(*["127.0.0.1"] * 4)


@pytest.fixture
def fleet(tmp_path: Path, agent_ports: list[int]) -> Path:
    p = agent_ports
    directory = tmp_path / "fleet-git"
    write_fleet(directory, p, [f"[alpha, {p[0]}]", f"[beta, {p[1]}]", f"[gamma, {p[2]}]"], '["--enable-prefix-caching"]')
    git(directory, "init", "-q", "-b", "main")
    git(directory, "add", "-A")
    git(directory, "commit", "-q", "-m", "three servers")
    return directory


@pytest.fixture
def plane(tmp_path: Path, fleet: Path) -> Iterator[str]:
    port = free_port()
    config = tmp_path / "control-plane.yaml"
    config.write_text(f"""\
repo:
  path: {fleet}
  branch: main
  refresh_interval_s: 1
secrets:
  fleet_key: ${{env:FLEETLLM_FLEET_KEY}}
  vllm_api_salt: ${{env:FLEETLLM_VLLM_API_SALT}}
listen: 127.0.0.1:{port}
state:
  url: sqlite:///{tmp_path}/state.sqlite3
viewer_tokens: ["${{env:FLEETLLM_VIEWER_TOKEN}}"]
""")
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "FLEETLLM_FLEET_KEY": FLEET_KEY,
           "FLEETLLM_VLLM_API_SALT": TEST_SALT, "FLEETLLM_VIEWER_TOKEN": VIEWER_TOKEN}
    process = subprocess.Popen([str(FLEETLLM), "serve", "--config", str(config)], env=env, cwd=tmp_path,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until("the control plane's /health", lambda: http_status(url + "/health") == 200, 120)
        yield url
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture
def proxy(plane: str) -> Iterator[Proxy]:
    running = Proxy(int(plane.rsplit(":", 1)[1])).start()
    yield running
    running.stop()


def stored_report(plane: str) -> dict[str, Any]:
    request = urllib.request.Request(plane + "/admin/reports", headers={"Authorization": f"Bearer {VIEWER_TOKEN}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        boxes: dict[str, Any] = json.loads(response.read())["boxes"]
    return boxes.get(BOX, {})


def program_pid(supervisor: Supervisor, program: str) -> int:
    return supervisor.pid(program)


def healthy(port: int) -> bool:
    return http_status(f"http://127.0.0.1:{port}/health") == 200


def commit(fleet: Path, message: str) -> str:
    git(fleet, "add", "-A")
    git(fleet, "commit", "-q", "-m", message)
    return git(fleet, "rev-parse", "HEAD")


def test_agent_follows_commits_restarting_only_what_changed(plane: str, proxy: Proxy, fleet: Path,
                                                           supervisor: Supervisor, box_env: Path,
                                                           agent_ports: list[int]) -> None:
    try:
        follow_commits(plane, proxy, fleet, supervisor, box_env, agent_ports)
    except AssertionError as exc:  # the agent's own log says why
        log = box_env / "fleetllm" / "logs" / "agent.log"
        tail = log.read_text()[-4000:] if log.exists() else "(no agent log)"
        raise AssertionError(f"{exc}\n--- agent.log ---\n{tail}") from exc


def follow_commits(plane: str, proxy: Proxy, fleet: Path, supervisor: Supervisor, box_env: Path,
                   agent_ports: list[int]) -> None:
    p = agent_ports
    env = {k: v for k, v in os.environ.items() if k != "LLMAO_HOST"}
    env.update({"FLEETLLM_URL": proxy.url, "PUBLIC_IPADDR": BOX, "FLEETLLM_PYTHON": sys.executable})
    done = subprocess.run(["bash", str(ROOT / "installer" / "fleetllm_installer" / "provision" / "vast.sh")],
                          env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert FLEET_KEY not in done.stderr
    (installed,) = proxy.reports()
    assert installed["agent"] is True  # the installer installed the agent, and says so
    assert stored_report(plane)["agent"] is True
    wait_until("every program RUNNING", lambda: supervisor.states() == dict.fromkeys(
        ["fleetllm-agent", "fleetllm-alpha", "fleetllm-beta", "fleetllm-gamma"], "RUNNING"), 60)
    conf = Path(os.environ["FLEETLLM_SUPERVISOR_CONF_DIR"])
    assert FLEET_KEY not in (conf / "fleetllm-agent.conf").read_text()
    key_file = box_env / "fleetllm" / "agent" / "credentials" / "fleet-key"
    assert key_file.stat().st_mode & 0o777 == 0o600
    agent_pid = program_pid(supervisor, "fleetllm-agent")
    assert FLEET_KEY.encode() not in Path(f"/proc/{agent_pid}/cmdline").read_bytes()

    # An unchanged config costs a 304.
    wait_until("the agent's 304", lambda: 304 in proxy.agent_gets(), 60)
    assert all(e["agent_header"] == f"fleetllm-agent/{__version__}" for e in proxy.log
               if e["agent_header"].startswith("fleetllm-agent"))
    assert len(proxy.reports()) == 1  # nothing applied, nothing reported
    # supervisord calls a program RUNNING once its launcher has run `startsecs`; the stub vLLM it execs
    # (after the servers before it answer /health) records its start later, on a loaded machine after
    # the next report. Serving, each has started.
    wait_until("alpha, beta and gamma serving", lambda: all(healthy(port) for port in p[:3]), 60)
    pids = {name: program_pid(supervisor, f"fleetllm-{name}") for name in ("alpha", "beta", "gamma")}

    # A commit that changes only the revision: applied and reported, nothing restarted.
    (fleet / "README.md").write_text("notes\n")
    started = time.monotonic()
    revision = commit(fleet, "notes only")
    wait_until("the report of the notes commit", lambda: stored_report(plane).get("revision") == revision, 90)
    print(f"\nfigures: revision-only commit to report {time.monotonic() - started:.1f} s (poll_s {POLL_S}, "
          "control plane refresh 1 s)")
    report = stored_report(plane)
    assert report["agent"] is True
    assert report["outcome"] == "installed"
    assert {name: program_pid(supervisor, f"fleetllm-{name}") for name in pids} == pids
    assert [len(supervisor.pids(port)) for port in p[:3]] == [1, 1, 1]

    # Add a server, change one server's args, remove one: only those programs change.
    write_fleet(fleet, p, [f"[alpha, {p[0]}]", f"[beta, {p[1]}]", f"[alpha, {p[3]}, zalpha]"],
                '["--enable-prefix-caching", "--max-num-seqs", "8"]')
    started = time.monotonic()
    revision = commit(fleet, "zalpha in, beta's args, gamma out")
    wait_until("the report of the change", lambda: stored_report(plane).get("revision") == revision, 120)
    print(f"figures: add/change/remove commit to report {time.monotonic() - started:.1f} s "
          "(stub vLLM load 1.5 s, startsecs 1)")
    report = stored_report(plane)
    assert report["agent"] is True
    assert report["outcome"] == "installed", report
    assert {s["name"]: s["state"] for s in report["report"]["servers"]} == dict.fromkeys(
        ["alpha", "beta", "zalpha"], "started")
    assert report["report"]["units_removed"] == ["fleetllm-gamma"]
    assert report["staleness"]["stale"] is False
    assert set(supervisor.states()) == {"fleetllm-agent", "fleetllm-alpha", "fleetllm-beta", "fleetllm-zalpha"}
    assert program_pid(supervisor, "fleetllm-alpha") == pids["alpha"]  # unchanged: not restarted
    assert len(supervisor.pids(p[0])) == 1
    assert program_pid(supervisor, "fleetllm-beta") != pids["beta"]  # its args changed: restarted
    wait_until("beta's new stub started", lambda: len(supervisor.pids(p[1])) >= 2, 60)  # see above
    assert len(supervisor.pids(p[1])) == 2
    wait_until("gamma stopped", lambda: not pid_alive(pids["gamma"]), 30)
    assert not (conf / "fleetllm-gamma.conf").exists()
    wait_until("zalpha and beta healthy", lambda: healthy(p[3]) and healthy(p[1]), 60)
    assert program_pid(supervisor, "fleetllm-agent") == agent_pid  # the agent did not restart itself
    served_after = len(proxy.agent_gets())
    wait_until("a 304 after the change", lambda: 304 in proxy.agent_gets()[served_after:], 60)
    sizes = {e["status"]: e["bytes"] for e in proxy.log if e["agent_header"].startswith("fleetllm-agent/")
             and e["path"] == "/vllm/config"}
    print(f"figures: agent GETs {len(proxy.agent_gets())} ({proxy.agent_gets().count(304)} were 304); "
          f"body bytes by status {sizes}")

    # The box JSON drops the agent (the box went manual): the agent removes itself, nothing else changes.
    proxy.inject = False
    wait_until("fleetllm-agent removed", lambda: "fleetllm-agent" not in supervisor.states(), 90)
    wait_until("the agent process gone", lambda: not pid_alive(agent_pid), 60)
    assert "agent" not in proxy.reports()[-1]
    assert stored_report(plane)["agent"] is False
    assert not key_file.exists()
    assert not (conf / "fleetllm-agent.conf").exists()
    assert program_pid(supervisor, "fleetllm-alpha") == pids["alpha"]
    assert [len(supervisor.pids(port)) for port in (p[0], p[1], p[3])] == [1, 2, 1]
