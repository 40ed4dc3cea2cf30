"""A GPU box on a loopback address for end-to-end tests: its own data dir, a real supervisord, the stub
vLLM as `vllm` and the fake nvidia-smi on its PATH, provisioned by installer/fleetllm_installer/provision/vast.sh against a
control plane URL, as a Vast box would be."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.installer.realprocs import SUPERVISORD, Supervisor, wait_until, write_supervisord_conf

ROOT = Path(__file__).resolve().parents[2]
SUPPORT = ROOT / "tests" / "support"


class Box:
    """`stub_env` reaches every stub through supervisord's environment (STUB_VLLM_* knobs)."""

    def __init__(self, name: str, root: Path, stub_env: dict[str, str] | None = None) -> None:
        self.name, self.root = name, root
        self.bin = root / "bin"
        self.bin.mkdir(parents=True)
        (self.bin / "vllm").symlink_to(SUPPORT / "stub_vllm.py")
        (self.bin / "nvidia-smi").symlink_to(SUPPORT / "fake_nvidia_smi.py")
        self.short = Path(tempfile.mkdtemp(prefix="llmf-box-", dir="/tmp"))
        conf_dir = root / "conf.d"
        conf_dir.mkdir()
        self.config = write_supervisord_conf(root, self.short, conf_dir)
        self.path = os.pathsep.join([str(self.bin), str(Path(sys.executable).parent), "/usr/bin", "/bin"])
        process = subprocess.Popen([str(SUPERVISORD), "-n", "-c", str(self.config)],
                                   env={"PATH": self.path, "HOME": str(root), "STUB_VLLM_LOAD_S": "0.5",
                                        **(stub_env or {})},
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.supervisor = Supervisor(self.config, process, root / "events.jsonl")
        wait_until("supervisord's socket", lambda: (self.short / "supervisor.sock").exists(), 30)

    def provision_env(self, plane: str, fleet_key: str, **extra: str) -> dict[str, str]:
        return {"PATH": self.path, "HOME": str(self.root), "PUBLIC_IPADDR": self.name, "FLEETLLM_URL": plane,
                "FLEETLLM_FLEET_KEY": fleet_key, "FLEETLLM_PYTHON": sys.executable,
                "FLEETLLM_DATA_DIR": str(self.root / "data"), "FLEETLLM_SUPERVISOR_CONF_DIR": str(self.root / "conf.d"),
                "FLEETLLM_SUPERVISOR_CONFIG": str(self.config), "FLEETLLM_LISTEN_HOST": self.name,
                "FLEETLLM_STARTSECS": "1", "FLEETLLM_START_TIMEOUT_S": "60", "FLEETLLM_FETCH_DEADLINE_S": "0",
                "FAKE_NVIDIA_SMI_GPUS": "NVIDIA H100 80GB HBM3:81559:81080", **extra}

    def provision(self, plane: str, fleet_key: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", str(ROOT / "installer" / "fleetllm_installer" / "provision" / "vast.sh")],
                              env=self.provision_env(plane, fleet_key, **extra), capture_output=True, text=True,
                              timeout=300, check=False)

    def stop(self) -> None:
        self.supervisor.process.send_signal(signal.SIGTERM)
        try:
            self.supervisor.process.wait(timeout=90)
        except subprocess.TimeoutExpired:
            self.supervisor.process.kill()
            self.supervisor.process.wait()
        shutil.rmtree(self.short, ignore_errors=True)
