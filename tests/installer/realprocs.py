"""Helpers for tests that run real processes: waiting, HTTP probes, a supervisord config in a temp dir."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleetllm.demo.procs import alive as pid_alive
from fleetllm.demo.procs import pids_mentioning

__all__ = ["SUPERVISORD", "Supervisor", "http_status", "pid_alive", "pids_mentioning", "wait_until",
           "write_supervisord_conf"]


def wait_until(what: str, check: Callable[[], Any], timeout_s: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def http_status(url: str, bearer: str | None = None) -> int | None:
    request = urllib.request.Request(url)
    if bearer:
        request.add_header("Authorization", f"Bearer {bearer}")
    try:
        with urllib.request.urlopen(request, timeout=2) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return None


def write_supervisord_conf(tmp_path: Path, short: Path, conf_dir: Path) -> Path:
    """A supervisord config with its socket under `short` (unix socket paths are limited to ~100 bytes)."""
    config = tmp_path / "supervisord.conf"
    config.write_text(f"""\
[unix_http_server]
file={short}/supervisor.sock
chmod=0700

[supervisord]
nodaemon=true
logfile={tmp_path}/supervisord.log
pidfile={short}/supervisord.pid
childlogdir={tmp_path}

[rpcinterface:supervisor]
supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface

[supervisorctl]
serverurl=unix://{short}/supervisor.sock

[include]
files = {conf_dir}/*.conf
""")
    return config


SUPERVISORD = Path(sys.executable).parent / "supervisord"


@dataclass
class Supervisor:
    """A running supervisord (see the `supervisor` fixture) and the stub vLLM's event log."""

    config: Path
    process: subprocess.Popen[bytes]
    events: Path

    def ctl(self, *args: str) -> str:
        done = subprocess.run([str(SUPERVISORD.parent / "supervisorctl"), "-c", str(self.config), *args],
                              capture_output=True, text=True, timeout=60, check=False)
        return done.stdout

    def pid(self, program: str) -> int:
        """The program's pid, 0 while it is stopped or absent (between the remove and the add of an
        `update`, `supervisorctl pid` prints "No such process")."""
        out = self.ctl("pid", program).strip()
        return int(out) if out.isdigit() else 0

    def states(self) -> dict[str, str]:
        return {line.split()[0]: line.split()[1] for line in self.ctl("status").splitlines() if line.strip()}

    def read_events(self) -> list[dict[str, Any]]:
        if not self.events.exists():
            return []
        return [json.loads(line) for line in self.events.read_text().splitlines() if line.strip()]

    def pids(self, port: int) -> list[int]:
        """The stub processes started on `port`, oldest first."""
        return [e["pid"] for e in self.read_events() if e["event"] == "start" and e["port"] == port]
