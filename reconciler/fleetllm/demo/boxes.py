"""A simulated GPU box: its own loopback address, data directory and supervisord, booted by the real
provisioning script, which fetches the real installer from the control plane.

    <scratch>/simulated-boxes/<addr>/bin/vllm         SIMULATED vLLM: runs reconciler/fleetllm/demo/stub_vllm.py
    <scratch>/simulated-boxes/<addr>/bin/nvidia-smi   SIMULATED nvidia-smi: the GPUs the placement declares
    <scratch>/simulated-boxes/<addr>/supervisord.conf  its own supervisord (socket: <scratch>/run/<addr>.sock)
    <scratch>/simulated-boxes/<addr>/data/            FLEETLLM_DATA_DIR (units' logs, the installer, HF cache)
    <scratch>/simulated-boxes/<addr>/provision.log    every provisioning run's output

With --real-vllm one more box runs the real vLLM (the CPU harness, reconciler/fleetllm/demo/realvllm.py): its
`vllm` is the harness's, and its supervisord's environment carries env.sh's CPU settings, as a box
template's environment would.

A Vast box's image already runs supervisord; vast.sh fetches and runs the installer, which updates it.
A RunPod box runs runpod.sh as its entrypoint: it runs the installer, then becomes supervisord. A
re-fetch is what a box restart does: vast.sh again, or (RunPod) the pod stopped and started again.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import xmlrpc.client
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from supervisor.xmlrpc import SupervisorTransport  # type: ignore[import-untyped]

import fleetllm_installer
from fleetllm.core.fleet.model import Fleet
from fleetllm.demo import procs
from fleetllm.demo.fleet import DemoError, SimBox, Template
from fleetllm.demo.realvllm import Harness
from fleetllm_contract.logfmt import iso_utc

PROVISION = Path(fleetllm_installer.__file__).resolve().parent / "provision"
SIMULATED_LOAD_S = 3  # how long each simulated vLLM "loads its weights" before it answers
INSTALL_TIMEOUT_S = 300


def _script(header: str, module: str, env: Mapping[str, str]) -> str:
    defaults = "".join(f"os.environ.setdefault({k!r}, {v!r})\n" for k, v in env.items())
    return (f"#!{sys.executable}\n# {header}\nimport os\nimport sys\n\n{defaults}\n"
            f"from {module} import main\n\nsys.exit(main())\n")


def json_line(event: str, **fields: str) -> str:
    """The demo's own marker in a box's provision.log, in the log format of the lines around it."""
    return json.dumps({"ts": iso_utc(time.time()), "level": "info", "logger": "fleetllm.demo", "event": event,
                       **fields}, separators=(",", ":"))


@dataclass(frozen=True)
class Provisioned:
    ok: bool
    log: str  # the tail of this run's output


class SimulatedBox:
    def __init__(self, sim: SimBox, root: Path, socket: Path, tag: str, harness: Harness | None = None) -> None:
        self.sim = sim
        self.harness = harness if sim.real_vllm else None
        self.tag = tag
        self.name = sim.name
        self.root = root
        self.bin = root / "bin"
        self.data = root / "data"
        self.conf_dir = root / "conf.d"
        self.config = root / "supervisord.conf"
        self.socket = socket
        self.log = root / "provision.log"
        self.supervisord: subprocess.Popen[bytes] | None = None

    def prepare(self, fleet: Fleet) -> None:
        """Tools on its PATH, its supervisord config, and its weights: a sparse placeholder of each
        recipe's disk_gb in the HF cache (nothing is downloaded), so the installer's disk check passes."""
        for path in (self.bin, self.data, self.conf_dir):
            path.mkdir(parents=True, exist_ok=True)
        tools = {
            "vllm": _script("SIMULATED vLLM for `fleetllm demo` (no GPU here): the stub speaks vLLM's HTTP API and "
                            "loads no model", "fleetllm.demo.stub_vllm", {"STUB_VLLM_LOAD_S": str(SIMULATED_LOAD_S)}),
            "nvidia-smi": _script("SIMULATED nvidia-smi for `fleetllm demo`: the GPUs placement.yaml declares",
                                  "fleetllm.demo.fake_nvidia_smi",
                                  {"FAKE_NVIDIA_SMI_GPUS": self.sim.nvidia_smi_gpus}),
        }
        if self.harness is not None:
            del tools["vllm"]
            (self.bin / "vllm").unlink(missing_ok=True)
            (self.bin / "vllm").symlink_to(self.harness.vllm)  # the real vLLM, found on PATH as on a box
        for name, text in tools.items():
            (self.bin / name).write_text(text, encoding="utf-8")
            (self.bin / name).chmod(0o755)
        self.config.write_text(f"""\
; supervisord of the simulated box {self.name} (fleetllm demo)
[unix_http_server]
file={self.socket}
chmod=0700

[supervisord]
nodaemon=true
silent=true
logfile={self.root}/supervisord.log
pidfile={self.root}/supervisord.pid
childlogdir={self.root}

[rpcinterface:supervisor]
supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface

[supervisorctl]
serverurl=unix://{self.socket}

[include]
files = {self.conf_dir}/*.conf
""", encoding="utf-8")
        box = fleet.boxes.get(self.name)
        for row in box.servers if box else ():
            weights = fleet.recipes[row.model].vllm
            if weights.disk_gb and not weights.model.startswith("/"):
                folder = self.data / "hf-cache" / "hub" / ("models--" + weights.model.replace("/", "--")) / "blobs"
                folder.mkdir(parents=True, exist_ok=True)
                with open(folder / "simulated-weights", "wb") as handle:
                    handle.truncate(int(weights.disk_gb * 1024 ** 3))

    def environment(self, url: str, fleet_key: str) -> dict[str, str]:
        venv_bin = str(Path(sys.executable).parent)
        provider_name = "RUNPOD_POD_ID" if self.sim.template is Template.RUNPOD else "PUBLIC_IPADDR"
        return {
            "PATH": os.pathsep.join([str(self.bin), venv_bin, "/usr/local/bin", "/usr/bin", "/bin"]),
            "HOME": str(self.root), "LANG": "C.UTF-8", provider_name: self.sim.provider_id or self.name,
            "FLEETLLM_URL": url, "FLEETLLM_FLEET_KEY": fleet_key, "FLEETLLM_PYTHON": sys.executable,
            "FLEETLLM_DATA_DIR": str(self.data), "FLEETLLM_SUPERVISOR_CONF_DIR": str(self.conf_dir),
            "FLEETLLM_SUPERVISOR_CONFIG": str(self.config), "FLEETLLM_LISTEN_HOST": self.sim.listen,
            "FLEETLLM_VLLM_BIN": str(self.bin / "vllm"), "FLEETLLM_GATEWAY_PYTHON": sys.executable,
            "FLEETLLM_STARTSECS": "1", "FLEETLLM_FETCH_DEADLINE_S": "30",
            # a real vLLM on shared CPU cores takes a minute or more before the next on its card may start
            "FLEETLLM_START_TIMEOUT_S": "900" if self.harness is not None else "300",
            **dict(self.sim.env),
        }

    def _start_supervisord(self) -> None:
        env = {"PATH": os.pathsep.join([str(self.bin), str(Path(sys.executable).parent), "/usr/bin", "/bin"]),
               "HOME": str(self.root), "LANG": "C.UTF-8",
               **(self.harness.box_env() if self.harness is not None else {})}
        self.supervisord = procs.start([str(Path(sys.executable).parent / "supervisord"), "-n", "-c",
                                        str(self.config)], env=env, log=self.log, tag=self.tag)
        procs.wait_until(f"the supervisord of {self.name}", self._answers, 30)

    def _answers(self) -> bool:
        if self.supervisord is not None and self.supervisord.poll() is not None:
            raise DemoError(f"the supervisord of {self.name} exited; see {self.log}:\n{procs.tail(self.log)}")
        return self.states() is not None

    def provision(self, url: str, fleet_key: str) -> Provisioned:
        """Boot (or re-fetch): run the box's provisioning script against the control plane."""
        start = self.log.stat().st_size if self.log.exists() else 0
        env = self.environment(url, fleet_key)
        procs.append(self.log, json_line("provisioning", box=self.name, template=str(self.sim.template)))
        if self.sim.template is Template.VAST:
            if self.supervisord is None or self.supervisord.poll() is not None:
                self._start_supervisord()
            code = procs.run(["bash", str(PROVISION / "vast.sh")], env=env, log=self.log, tag=self.tag,
                             timeout_s=INSTALL_TIMEOUT_S)
            ok = code == 0
        else:  # the pod restarts: its supervisord stops, and runpod.sh runs again and becomes supervisord
            self.stop()
            self.supervisord = procs.start(["bash", str(PROVISION / "runpod.sh")], env=env, log=self.log,
                                           tag=self.tag)
            procs.wait_until(f"runpod.sh on {self.name} to start supervisord", self._answers, INSTALL_TIMEOUT_S)
            ok = "handed to supervisord" in self._since(start)  # the installer's last line on success
        return Provisioned(ok, "\n".join(self._since(start).splitlines()[-12:]))

    def _since(self, offset: int) -> str:
        with open(self.log, "rb") as handle:
            handle.seek(offset)
            return handle.read().decode(errors="replace")

    def states(self) -> dict[str, str] | None:
        """Supervisor's state of each program (RUNNING, STARTING...), over its XML-RPC socket; None when
        supervisord does not answer."""
        if not self.socket.exists():
            return None
        proxy = xmlrpc.client.ServerProxy("http://127.0.0.1",
                                          transport=SupervisorTransport(None, None, f"unix://{self.socket}"))
        try:
            infos = proxy.supervisor.getAllProcessInfo()
        except (OSError, xmlrpc.client.Error):
            return None
        if not isinstance(infos, list):
            return None
        return {str(i["name"]): str(i["statename"]) for i in infos if isinstance(i, dict)}

    def stop(self) -> None:
        """supervisord stops its programs (stopasgroup) on SIGTERM, then exits."""
        if self.supervisord is not None:
            procs.stop(self.supervisord, timeout_s=90)
            self.supervisord = None
