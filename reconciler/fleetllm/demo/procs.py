"""Processes and probes for the demo: ports, waiting, HTTP, and stopping what it started.

Every long-lived process starts in its own session (its own process group), so Ctrl-C reaches only
the demo, which then stops them in order; each is stopped through its group. Every process it starts
carries FLEETLLM_DEMO_RUN=<scratch directory> in its environment, which whatever they start inherits
(supervisord's programs, PostgreSQL, LiteLLM's query engine): the last step of a shutdown is a sweep
for processes still carrying it. A process of the user's that merely names the scratch directory (a
`tail -f` of a log, the shell that started the demo) carries no tag and is never touched.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, TypeVar

from fleetllm.demo.fleet import DemoError

T = TypeVar("T")

# Set by the demo's stop-signal handler (run._interrupt). Its KeyboardInterrupt is lost when the signal
# lands inside a finalizer (Python reports an exception raised in __del__ and drops it; GitPython's
# Repo.__del__ waits on a child): `pause`, where the demo's loops wait, raises it again.
stop_asked = threading.Event()


def pause(seconds: float) -> None:
    """Sleep `seconds`, or raise KeyboardInterrupt when a stop signal came (now or earlier)."""
    if stop_asked.wait(seconds):
        raise KeyboardInterrupt


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def can_bind(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def wait_until(what: str, check: Callable[[], T | None], timeout_s: float, interval_s: float = 0.2) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise DemoError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(interval_s)


def http_get(url: str, headers: Mapping[str, str] | None = None, timeout_s: float = 3.0) -> tuple[int | None, bytes]:
    """(status, body); status None when nothing answered."""
    request = urllib.request.Request(url, headers=dict(headers or {}))  # noqa: S310 (http on loopback)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310 (http on loopback)
            return int(response.status), response.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read()
    except OSError:
        return None, b""


TAG = "FLEETLLM_DEMO_RUN"


def start(argv: list[str], *, env: Mapping[str, str], log: Path, tag: str,
          cwd: Path | None = None) -> subprocess.Popen[bytes]:
    """A long-lived process in its own session, tagged, its output appended to `log`."""
    with open(log, "ab") as out:
        return subprocess.Popen(argv, env={**env, TAG: tag}, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)


def run(argv: list[str], *, env: Mapping[str, str], log: Path, tag: str, timeout_s: float,
        cwd: Path | None = None) -> int:
    """A short-lived step (an install, a build) in its own session, tagged, its output appended to `log`."""
    with open(log, "ab") as out:
        process = subprocess.Popen(argv, env={**env, TAG: tag}, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            return process.wait(timeout=timeout_s)
        except BaseException:  # a timeout or Ctrl-C: the step does not outlive the demo
            stop(process, timeout_s=10)
            raise


def _signal_group(process: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)


def stop(process: subprocess.Popen[bytes], timeout_s: float) -> None:
    """SIGTERM to the process's group, then SIGKILL to it after `timeout_s`."""
    if process.poll() is None:
        _signal_group(process, signal.SIGTERM)
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _signal_group(process, signal.SIGKILL)
            process.wait(timeout=10)


def alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status


def pids_mentioning(text: str) -> list[int]:
    """Live processes, other than this one, whose command line contains `text`."""
    found = []
    for path in Path("/proc").glob("[0-9]*/cmdline"):
        pid = int(path.parent.name)
        try:
            if text.encode() in path.read_bytes() and pid != os.getpid() and alive(pid):
                found.append(pid)
        except OSError:  # gone meanwhile
            continue
    return sorted(found)


def tagged(tag: str) -> list[int]:
    """Live processes, other than this one, whose environment carries TAG=`tag`."""
    marker = f"{TAG}={tag}".encode() + b"\0"
    found = []
    for path in Path("/proc").glob("[0-9]*/environ"):
        pid = int(path.parent.name)
        try:
            if marker in path.read_bytes() + b"\0" and pid != os.getpid() and alive(pid):
                found.append(pid)
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return sorted(found)


def sweep(tag: str, timeout_s: float = 10.0) -> list[int]:
    """Stop every process still tagged `tag`: SIGTERM, then SIGKILL. Returns the pids it had to stop
    (each one a shutdown step that did not do its job)."""
    leftovers = tagged(tag)
    for pid in leftovers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(alive(p) for p in leftovers):
        time.sleep(0.1)
    for pid in leftovers:
        if alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    return leftovers


def tail(path: Path, lines: int = 20) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 16384))
            data = handle.read()
    except OSError:
        return ""
    return "\n".join(data.decode(errors="replace").splitlines()[-lines:])


def append(log: Path, text: str) -> None:
    handle: IO[str]
    with open(log, "a", encoding="utf-8") as handle:
        handle.write(text if text.endswith("\n") else text + "\n")
