"""Real processes for the reconciler's integration tests."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STUB = ROOT / "tests" / "support" / "stub_vllm.py"


class Stub:
    """One stub vLLM process: `vllm serve` as the installer's Supervisor unit would run it."""

    def __init__(self, host: str, port: int, model: str, served: str, bearer: str) -> None:
        self.host, self.port = host, port
        self.process = subprocess.Popen(
            [sys.executable, str(STUB), "serve", model, "--host", host, "--port", str(port),
             "--served-model-name", served, "--max-model-len", "4096"],
            env={**os.environ, "VLLM_API_KEY": bearer}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://{host}:{port}/health", timeout=1):
                    return
            except OSError:
                time.sleep(0.05)
        self.kill()
        raise AssertionError(f"stub vLLM on {host}:{port} did not come up")

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(timeout=10)
