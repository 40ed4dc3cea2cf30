"""The CI job after a merge, as the demo plays it: `fleetllm rollout wait COMMIT` as a process of its own
(the shipped command, through the control plane's admin API, as a GitHub Actions job would run it), started
when a scenario commits and collected when the rollout has converged or halted. Its exit status is the
job's outcome: 0 converged, 1 halted (rolled back), 2 timed out. Its output is kept in
<scratch>/control-plane/rollout-wait-<commit>.log."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass

from fleetllm.demo import procs
from fleetllm.demo.workspace import Workspace

INTERVAL_S = 1.0  # how often the job looks (the demo's passes run every 2 s)
COLLECT_S = 60.0  # once the demo saw the end, the job has this long to see it too


@dataclass(frozen=True)
class Waited:
    code: int | None  # None: it had not ended COLLECT_S after the rollout did (stopped)
    last: str  # its last line

    def line(self, commit: str) -> str:
        said = "did not end" if self.code is None else f"exited {self.code}"
        return f"  CI: fleetllm rollout wait {commit[:12]} {said}: {self.last}"


class CiWait:
    def __init__(self, workspace: Workspace, url: str, commit: str, timeout_s: float) -> None:
        self.log = workspace.control_plane / f"rollout-wait-{commit[:12]}.log"
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(workspace.root), "LANG": "C.UTF-8"}
        argv = [sys.executable, "-m", "fleetllm", "rollout", "wait", commit, "--url", url, "--token-file",
                str(workspace.secret_file("admin-token")), "--interval", str(INTERVAL_S), "--timeout", f"{timeout_s:g}"]
        self.process = procs.start(argv, env=env, log=self.log, tag=workspace.tag, cwd=workspace.control_plane)

    def collect(self, timeout_s: float = COLLECT_S) -> Waited:
        try:
            code: int | None = self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            procs.stop(self.process, timeout_s=10)
            code = None
        lines = [line for line in self.log.read_text(errors="replace").splitlines() if line.strip()]
        return Waited(code, lines[-1].split("] ", 1)[-1] if lines else "(no output)")

    def stop(self) -> None:
        procs.stop(self.process, timeout_s=10)
