"""The real control plane as a process (`fleetllm serve`) for fault, storm and secret tests.

A config file in a temp dir (secrets as ${env:} references only), an ephemeral loopback port, its log
(stdout + stderr) in a file, and every process of its session group stopped at the end. `rss()` reads
the resident and peak memory (VmRSS, VmHWM) of the server process (and any children) from /proc.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fleetllm.demo.procs import free_port as free_port  # re-exported for the tests
from fleetllm.demo.procs import stop

FLEETLLM = Path(sys.executable).parent / "fleetllm"


def request(url: str, headers: dict[str, str] | None = None, method: str = "GET", data: bytes | None = None,
            timeout: float = 10) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of one request; HTTP errors are answers too."""
    req = urllib.request.Request(url, headers=headers or {}, method=method, data=data)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as response:
            return int(response.status), dict(response.headers), bytes(response.read())
    except urllib.error.HTTPError as exc:
        return int(exc.code), dict(exc.headers), bytes(exc.read())


def _proc_kib(pid: int, field_name: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def children(pid: int) -> list[int]:
    found = []
    for path in Path("/proc").glob(f"{pid}/task/*/children"):
        try:
            found.extend(int(p) for p in path.read_text().split())
        except OSError:
            continue
    return found


@dataclass
class Memory:
    rss_kib: int  # now, server + worker
    peak_kib: int  # VmHWM summed: the most each process ever held resident

    @property
    def rss_mib(self) -> float:
        return round(self.rss_kib / 1024, 1)

    @property
    def peak_mib(self) -> float:
        return round(self.peak_kib / 1024, 1)


@dataclass
class ControlPlane:
    """`fleetllm serve --config FILE` on 127.0.0.1:<free port>."""

    directory: Path
    document: dict[str, Any]
    env: dict[str, str]
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def config(self) -> Path:
        return self.directory / "control-plane.yaml"

    @property
    def log(self) -> Path:
        return self.directory / "serve.log"

    def start(self, *, wait_status: tuple[int, ...] = (200,), timeout_s: float = 60) -> ControlPlane:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.document["listen"] = f"127.0.0.1:{self.port}"
        self.config.write_text(yaml.safe_dump(self.document, sort_keys=False))
        with self.log.open("ab") as log:
            self.process = subprocess.Popen([str(FLEETLLM), "serve", "--config", str(self.config)],
                                            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                                                 "HOME": str(self.directory), **self.env},
                                            cwd=self.directory, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                status, _, _ = request(self.url + "/health", timeout=2)
                if status in wait_status:
                    return self
            except OSError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"the control plane did not come up:\n{self.log.read_text()[-4000:]}")
            time.sleep(0.1)

    def get(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        return request(self.url + path, headers)

    def json(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, Any]:
        status, _, body = self.get(path, headers)
        return status, json.loads(body)

    def log_events(self, name: str | None = None) -> list[dict[str, Any]]:
        lines = [json.loads(line) for line in self.log.read_text().splitlines() if line.startswith("{")]
        return [e for e in lines if name is None or e.get("event") == name]

    def pids(self) -> list[int]:
        """The server process and its children (none since the server runs in one process)."""
        assert self.process is not None
        return [self.process.pid, *children(self.process.pid)]

    def memory(self) -> Memory:
        pids = self.pids()
        return Memory(sum(_proc_kib(p, "VmRSS") for p in pids), sum(_proc_kib(p, "VmHWM") for p in pids))

    def stop(self) -> int | None:
        """SIGTERM to the whole session (the server writes out what it buffered), SIGKILL after 30 s."""
        if self.process is None:
            return None
        stop(self.process, timeout_s=30)
        return self.process.returncode
