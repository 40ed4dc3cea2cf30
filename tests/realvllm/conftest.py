"""The real-vLLM suite's fixtures: one box of two real `vllm serve` processes, shared by every test.

Real vLLM on 2 shared cores takes 40-90 s to start, so the suite starts the box once per session:

- a fleet git repository whose two models (tiny-a, tiny-b) are the harness's tiny Llama, with the CPU
  flags a recipe would carry in `settings` (--kv-cache-memory-bytes, --max-num-seqs) on one box
  127.0.0.2 (provider static) and one card, so the second server waits for the first;
- `fleetllm serve` (the control plane) as a process, with the real LiteLLM proxy configured;
- the box: a real supervisord whose environment holds env.sh's CPU settings (as a Vast/RunPod template
  puts them into the container), a fake nvidia-smi (one H100), and `vllm` on PATH being the harness's;
  provisioned by installer/fleetllm_installer/provision/vast.sh, which fetches the installer from the control plane, which
  fetches the box JSON and writes the Supervisor programs;
- while it starts, the fixture records what a watcher sees every 0.25 s (the startup timeline: whether
  each port refuses or answers /health, and whether tiny-b's program is still the launcher) and a
  `fleetllm plan` of the loading box; the tests judge those records, so no test depends on running first.

Tests that disturb a server (SIGKILL) wait for it to come back before they end.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
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

from fleetllm.core.fleet.bearer import Salt
from fleetllm.demo.procs import free_port
from tests.conftest import git
from tests.installer.realprocs import SUPERVISORD, Supervisor, http_status, wait_until, write_supervisord_conf
from tests.realvllm.harness import Harness, harness_from_env
from tests.support.integration import missing
from tests.support.litellm import SKIP_REASON, LitellmProxy, proxy_from_env
from tests.support.ports import free_ports

ROOT = Path(__file__).resolve().parents[2]
SUPPORT = ROOT / "tests" / "support"
FLEETLLM = Path(sys.executable).parent / "fleetllm"
BOX = "127.0.0.2"
SALT = "realvllm-salt-0123456789abcdef"
FLEET_KEY = "realvllm-fleet-key-0001"
MAX_NUM_SEQS = 8  # the recipes' max-num-seqs: what the gateway's per-model limit is derived from
KV_CACHE_BYTES = 64 * 1024 * 1024  # 32k tokens of KV cache; saves ~1 GB per server over VLLM_CPU_KVCACHE_SPACE=1
START_TIMEOUT_S = 900.0  # a first start in an empty compile cache, two at once, on a loaded machine


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.realvllm)
            # The first test pays for the session's box: two real vLLM starts, one after the other.
            item.add_marker(pytest.mark.timeout(1800))


@pytest.fixture(scope="session")
def harness() -> Harness:
    return harness_from_env()


@pytest.fixture(scope="session")
def litellm_proxy() -> LitellmProxy:
    proxy = proxy_from_env()
    if proxy is None:
        missing(SKIP_REASON)
    assert proxy is not None
    status, _ = proxy.call("GET", "/health/readiness", timeout=10)
    if status != 200:
        pytest.fail(f"the LiteLLM proxy at {proxy.url} is not ready (GET /health/readiness: {status})")
    return proxy


def connect_state(host: str, port: int) -> str:
    """'refused', 'open' (accepts connections) or 'other: ...'."""
    with socket.socket() as sock:
        sock.settimeout(2)
        code = sock.connect_ex((host, port))
    if code == 0:
        return "open"
    return "refused" if code == errno.ECONNREFUSED else f"other: {errno.errorcode.get(code, code)}"


@dataclass
class Sample:
    t: float
    a: str  # tiny-a: refused / open / 200 ...
    b: str
    b_program: str  # what tiny-b's Supervisor process is: launcher / vllm / none


@dataclass
class RealBox:
    harness: Harness
    root: Path
    litellm: LitellmProxy
    ports: dict[str, int]  # model -> port
    plane_port: int = field(default_factory=free_port)
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    supervisor: Supervisor | None = None
    short: Path | None = None
    timeline: list[Sample] = field(default_factory=list)
    loading_plan: str = ""
    provision_output: str = ""
    started_s: float = 0.0
    ready_s: dict[str, float] = field(default_factory=dict)

    @property
    def plane(self) -> str:
        return f"http://127.0.0.1:{self.plane_port}"

    @property
    def config(self) -> Path:
        return self.root / "control-plane.yaml"

    def bearer(self, model: str) -> str:
        return Salt(SALT).derive(BOX, self.ports[model])

    def url(self, model: str) -> str:
        return f"http://{BOX}:{self.ports[model]}"

    def env(self, **extra: str) -> dict[str, str]:
        return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.root), "FL_FLEET_KEY": FLEET_KEY,
                "FL_SALT": SALT, "FL_LITELLM_KEY": self.litellm.master_key, **extra}

    def fleetllm(self, *args: str, config: Path | None = None, **env: str) -> tuple[int, str]:
        done = subprocess.run([str(FLEETLLM), *args, "--config", str(config or self.config)], env=self.env(**env),
                              cwd=self.root, capture_output=True, text=True, timeout=300, check=False)
        return done.returncode, done.stdout + done.stderr

    # -- the fleet repository and the control plane -------------------------------------------------
    def write_fleet(self) -> None:
        repo = self.root / "fleet"
        repo.mkdir()
        git(repo, "init", "-q", "-b", "main")
        ports = sorted(self.ports.values())
        (repo / "fleet.yaml").write_text(
            "version: 1\nfleet_id: test-fleet\n"
            f"listen_ports: [{', '.join(str(p) for p in ports)}]\n"
            "reconcile:\n  health_grace_s: 900\n  probe_timeout_s: 10\n  down_after_failures: 2\n"
            "  up_after_successes: 2\n  max_deletes_per_pass: 10\n  max_delete_fraction: 1.0\n"
            "rollout: {mode: manual}\n")  # the box as the contract has it (no agent): the suite is about vLLM
        recipe = (f"    vllm:\n      model: {self.harness.model}\n      max_model_len: 512\n      vram_gb: 1\n"
                  "      disk_gb: 0\n      settings:\n"
                  f"        kv-cache-memory-bytes: {KV_CACHE_BYTES}\n        max-num-seqs: {MAX_NUM_SEQS}\n")
        (repo / "models.yaml").write_text("models:\n" + "".join(f"  {m}:\n{recipe}" for m in self.ports))
        servers = "".join(f"      - [{m}, {p}]\n" for m, p in self.ports.items())
        (repo / "placement.yaml").write_text(f"hosts:\n  {BOX}:\n    provider: static\n    servers:\n{servers}")
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", "two real vLLM servers on one box")

    def plane_config(self, salt_var: str = "FL_SALT", state: str = "state.sqlite3") -> str:
        return f"""\
repo:
  path: {self.root / 'fleet'}
  branch: main
  refresh_interval_s: 1
secrets:
  fleet_key: ${{env:FL_FLEET_KEY}}
  vllm_api_salt: ${{env:{salt_var}}}
listen: 127.0.0.1:{self.plane_port}
state:
  url: sqlite:///{self.root / state}
litellm:
  url: {self.litellm.url}
  master_key: ${{env:FL_LITELLM_KEY}}
providers:
  static: {{}}
"""

    def start_plane(self) -> None:
        self.config.write_text(self.plane_config())
        with (self.root / "serve.log").open("ab") as log:
            self.processes.append(subprocess.Popen([str(FLEETLLM), "serve", "--config", str(self.config)],
                                                   env=self.env(), cwd=self.root, stdout=log,
                                                   stderr=subprocess.STDOUT, start_new_session=True))
        wait_until("the control plane's /health", lambda: http_status(self.plane + "/health") == 200, 120)

    # -- the box ------------------------------------------------------------------------------------
    @property
    def bin(self) -> Path:
        return self.root / "box" / "bin"

    def box_path(self) -> str:
        return os.pathsep.join([str(self.bin), str(Path(sys.executable).parent), "/usr/bin", "/bin"])

    def start_supervisord(self) -> None:
        box = self.root / "box"
        self.bin.mkdir(parents=True)
        (self.bin / "vllm").symlink_to(self.harness.vllm)  # the image's vLLM, found on PATH as on a box
        (self.bin / "nvidia-smi").symlink_to(SUPPORT / "fake_nvidia_smi.py")
        self.short = Path(tempfile.mkdtemp(prefix="llmf-rv-", dir="/tmp"))
        conf_dir = box / "conf.d"
        conf_dir.mkdir()
        config = write_supervisord_conf(box, self.short, conf_dir)
        # The template's environment reaches supervisord and every program it starts: env.sh's CPU settings.
        env = {"PATH": self.box_path(), "HOME": str(box), **self.harness.box_env(),
               "FAKE_NVIDIA_SMI_GPUS": "NVIDIA H100 80GB HBM3:81559:81080"}
        process = subprocess.Popen([str(SUPERVISORD), "-n", "-c", str(config)], env=env,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self.supervisor = Supervisor(config, process, box / "events.jsonl")
        wait_until("supervisord's socket", lambda: (self.short / "supervisor.sock").exists(), 30)

    def provision(self) -> None:
        box = self.root / "box"
        assert self.supervisor is not None
        env = {"PATH": self.box_path(), "HOME": str(box), "PUBLIC_IPADDR": BOX, "FLEETLLM_URL": self.plane,
               "FLEETLLM_FLEET_KEY": FLEET_KEY, "FLEETLLM_PYTHON": sys.executable,
               "FLEETLLM_DATA_DIR": str(box / "data"), "FLEETLLM_SUPERVISOR_CONF_DIR": str(box / "conf.d"),
               "FLEETLLM_SUPERVISOR_CONFIG": str(self.supervisor.config), "FLEETLLM_LISTEN_HOST": BOX,
               "FLEETLLM_STARTSECS": "1", "FLEETLLM_START_TIMEOUT_S": str(int(START_TIMEOUT_S)),
               "FLEETLLM_FETCH_DEADLINE_S": "0", "FAKE_NVIDIA_SMI_GPUS": "NVIDIA H100 80GB HBM3:81559:81080"}
        done = subprocess.run(["bash", str(ROOT / "installer" / "fleetllm_installer" / "provision" / "vast.sh")], env=env,
                              capture_output=True, text=True, timeout=300, check=False)
        self.provision_output = done.stdout + done.stderr
        assert done.returncode == 0, self.provision_output

    def program(self, model: str) -> str:
        assert self.supervisor is not None
        return next(name for name in self.supervisor.states() if name.endswith(model))

    def program_pid(self, model: str) -> int | None:
        assert self.supervisor is not None
        out = self.supervisor.ctl("pid", self.program(model)).strip()
        return int(out) if out.isdigit() and out != "0" else None

    def program_kind(self, model: str) -> str:
        pid = self.program_pid(model)
        if pid is None:
            return "none"
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return "none"
        text = b" ".join(argv).decode(errors="replace")
        return "launcher" if "fleetllm-launch" in text else "vllm" if " serve " in text else text[:80]

    def health(self, model: str) -> str:
        state = connect_state(BOX, self.ports[model])
        if state != "open":
            return state
        return str(http_status(self.url(model) + "/health"))

    def watch_startup(self) -> None:
        """Sample both servers until both answer /health 200, recording the timeline."""
        deadline = time.monotonic() + START_TIMEOUT_S
        b_model = sorted(self.ports)[1]
        while time.monotonic() < deadline:
            # tiny-b's program first, then the servers: the launcher starts `vllm serve` only once tiny-a
            # answered, and tiny-a keeps answering, so a sample that sees vllm also sees tiny-a at 200. (Read
            # after the health checks, tiny-a could turn ready and tiny-b's launcher exec in between: a CI run
            # saw a=refused with b=vllm in one sample.)
            kind = self.program_kind(b_model)
            a, b = (self.health(m) for m in sorted(self.ports))
            self.timeline.append(Sample(time.monotonic() - self.started_s, a, b, kind))
            for model, state in zip(sorted(self.ports), (a, b), strict=True):
                if state == "200":
                    self.ready_s.setdefault(model, time.monotonic() - self.started_s)
            if a == b == "200":
                return
            time.sleep(0.25)
        raise AssertionError(f"the real vLLM servers did not both answer /health within {START_TIMEOUT_S:g} s; "
                             f"last: {self.timeline[-1:]}\n{self.log_tail()}")

    def log_tail(self) -> str:
        logs = sorted((self.root / "box" / "data" / "fleetllm" / "logs").glob("*.log"))
        return "\n".join(f"== {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in logs)

    def wait_healthy(self, model: str, timeout_s: float = START_TIMEOUT_S) -> None:
        wait_until(f"{model} healthy", lambda: self.health(model) == "200", timeout_s)

    def vllm_pids(self) -> list[int]:
        """Every process of both programs' trees (API server, EngineCore, Worker, helpers)."""
        found = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                environ = (proc / "environ").read_bytes()
            except OSError:
                continue
            if b"FLEETLLM_SERVER=" in environ and f"HOME={self.root / 'box'}".encode() in environ:
                found.append(int(proc.name))
        return found

    def rss_mib(self) -> float:
        total = 0
        for pid in self.vllm_pids():
            try:
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
            except OSError:
                continue
        return round(total / 1024, 1)

    def stop(self) -> None:
        if self.supervisor is not None:
            self.supervisor.process.send_signal(signal.SIGTERM)
            try:
                self.supervisor.process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(self.supervisor.process.pid, signal.SIGKILL)
                self.supervisor.process.wait()
        for pid in self.vllm_pids():  # nothing of ours may outlive the suite
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        for process in self.processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
                try:
                    process.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
        if self.short is not None:
            shutil.rmtree(self.short, ignore_errors=True)


@pytest.fixture(scope="session")
def real_box(harness: Harness, litellm_proxy: LitellmProxy,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealBox]:
    root = tmp_path_factory.mktemp("realbox")
    box = RealBox(harness, root, litellm_proxy, dict(zip(("tiny-a", "tiny-b"), free_ports(BOX, BOX), strict=True)))
    litellm_proxy.reset()
    try:
        box.write_fleet()
        box.start_plane()
        box.start_supervisord()
        box.started_s = time.monotonic()
        box.provision()
        _, box.loading_plan = box.fleetllm("plan", "--format", "json")
        box.watch_startup()
        yield box
    finally:
        box.stop()
        litellm_proxy.reset()


def post_json(url: str, body: dict[str, Any], bearer: str | None, timeout: float = 120) -> tuple[int, Any]:
    import urllib.error
    import urllib.request

    headers = {"Content-Type": "application/json"}
    if bearer:
        headers["Authorization"] = f"Bearer {bearer}"
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return int(response.status), json.loads(response.read())
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            return int(exc.code), json.loads(raw)
        except ValueError:
            return int(exc.code), raw.decode(errors="replace")
