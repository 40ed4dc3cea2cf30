"""The control plane of the demo: `fleetllm serve` as its own process, as in production, on
127.0.0.1 and a free port, with its state in SQLite in the scratch directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from fleetllm.demo import procs
from fleetllm.demo.fleet import DemoError
from fleetllm.demo.workspace import Workspace

START_TIMEOUT_S = 120


class ControlPlane:
    def __init__(self, workspace: Workspace, port: int) -> None:
        self.workspace = workspace
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log = workspace.control_plane / "serve.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.workspace.root), "LANG": "C.UTF-8"}
        argv = [sys.executable, "-m", "fleetllm", "serve", "--config", str(self.workspace.config)]
        self.process = procs.start(argv, env=env, log=self.log, tag=self.workspace.tag,
                                   cwd=self.workspace.control_plane)
        procs.wait_until("the control plane's /health", self._healthy, START_TIMEOUT_S)

    def _healthy(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise DemoError(f"`fleetllm serve` exited with {self.process.returncode}; see {self.log}:\n"
                            + procs.tail(self.log))
        return self.revision() is not None

    def revision(self) -> str | None:
        """The commit it serves, from GET /health."""
        status, body = procs.http_get(self.url + "/health")
        if status != 200:
            return None
        try:
            revision = json.loads(body).get("revision")
        except ValueError:
            return None
        return revision if isinstance(revision, str) else None

    def wait_for(self, revision: str, timeout_s: float = 60) -> None:
        procs.wait_until(f"the control plane to serve {revision[:12]}", lambda: self.revision() == revision, timeout_s)

    def stop(self) -> None:
        if self.process is not None:
            procs.stop(self.process, timeout_s=30)
            self.process = None
