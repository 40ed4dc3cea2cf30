"""Writing the Supervisor files and handing the servers over to supervisord.

Files are created 0600 under a temporary name in the same directory and renamed into place, so a
reader (supervisord's `reread`) never sees a half-written file and no bearer is ever world-readable.
Only files that carry the installer's MARKER on their first line and the `fleetllm-` prefix are ever
removed: other programs in the include directory are not ours.
"""

from __future__ import annotations

import fcntl
import os
import re
import subprocess
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from fleetllm_installer.errors import InstallerError
from fleetllm_installer.launcher import PRESENT
from fleetllm_installer.settings import SECRET_VARS, Settings
from fleetllm_installer.units import MARKER, PREFIX, Unit

SUPERVISORCTL_TIMEOUT_S = 120.0


class HandoverError(InstallerError, RuntimeError):
    """Writing the files or talking to supervisord failed; the message says what to do."""


class LockBusyError(HandoverError):
    """Another installer run or the box agent holds the install lock."""


def write_atomic(path: Path, text: str | bytes, mode: int = 0o600) -> None:
    """Create `path` with `mode` from the first byte, via a temporary file and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.parent / f".{path.name}.tmp-{os.getpid()}"
    data = text.encode("utf-8") if isinstance(text, str) else text
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, mode)  # O_CREAT honours the umask; an old temp file keeps its mode
        os.replace(temporary, path)
    except OSError:
        temporary.unlink(missing_ok=True)
        raise


def launcher_source() -> str:
    """The launcher script's text, read from the package (works inside the zipapp too)."""
    return resources.files("fleetllm_installer").joinpath("launcher.py").read_text(encoding="utf-8")


def owned_units(conf_dir: Path) -> dict[str, Path]:
    """Program files this installer wrote earlier, keyed by file name."""
    owned: dict[str, Path] = {}
    if not conf_dir.is_dir():
        return owned
    for path in sorted(conf_dir.glob(f"{PREFIX}*.conf")):
        try:
            with path.open(encoding="utf-8", errors="replace") as handle:
                first = handle.readline().rstrip("\n")
        except OSError:
            continue
        if first == MARKER:
            owned[path.name] = path
    return owned


def foreign_vllm_units(conf_dir: Path) -> dict[str, frozenset[int]]:
    """Program files not written by us that run vLLM (e.g. llmao's vllm-*.conf), with the ports their
    commands name: reported, never removed."""
    found: dict[str, frozenset[int]] = {}
    if not conf_dir.is_dir():
        return found
    for path in sorted(conf_dir.glob("*.conf")):
        if path.name.startswith(PREFIX):
            continue
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        if "vllm serve" in text or "vllm.entrypoints" in text:
            found[path.name] = frozenset(int(p) for p in re.findall(r"--port[= ]+([0-9]{1,5})\b", text))
    return found


@dataclass(frozen=True)
class WriteResult:
    written: tuple[str, ...]
    removed: tuple[str, ...]  # program names


def write_units(settings: Settings, units: Iterable[Unit]) -> WriteResult:
    """Install the launcher, write every unit, then remove our units the new JSON no longer names."""
    units = list(units)
    try:
        for directory in (settings.log_dir, settings.hf_home, settings.conf_dir):
            directory.mkdir(parents=True, exist_ok=True)
        write_atomic(settings.launcher_path, launcher_source(), mode=0o700)
        # the servers now on the box: a launcher does not wait for one that left (launcher.PRESENT)
        write_atomic(settings.launcher_path.parent / PRESENT,
                     "".join(f"{u.server}={u.port}\n" for u in units if u.port is not None), mode=0o600)
        for unit in units:
            write_atomic(unit.path, unit.text)
        keep = {unit.path.name for unit in units}
        removed = []
        for name, path in owned_units(settings.conf_dir).items():
            if name not in keep:
                path.unlink()
                removed.append(name.removesuffix(".conf"))
    except OSError as exc:
        raise HandoverError(f"cannot write {exc.filename}: {exc.strerror}") from None
    return WriteResult(tuple(u.program for u in units), tuple(removed))


def _ctl_base(settings: Settings) -> list[str]:
    base = ["supervisorctl"]
    if settings.supervisor_config is not None:
        base += ["-c", str(settings.supervisor_config)]
    return base


def supervisorctl(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run([*_ctl_base(settings), *args], capture_output=True, text=True,
                              timeout=SUPERVISORCTL_TIMEOUT_S, check=False)
    except FileNotFoundError:
        raise HandoverError("supervisorctl is not on PATH: install supervisor (pip install supervisor)") from None
    except subprocess.TimeoutExpired:
        raise HandoverError(f"supervisorctl {' '.join(args)} did not finish within "
                            f"{SUPERVISORCTL_TIMEOUT_S:g} s") from None


def reread_and_update(settings: Settings) -> str:
    """`supervisorctl reread` + `update`: adds new programs, restarts changed ones, removes gone ones."""
    output = []
    for command in ("reread", "update"):
        done = supervisorctl(settings, command)
        text = (done.stdout + done.stderr).strip()
        output.append(text)
        if done.returncode != 0 or "refused connection" in text or "no such file" in text.lower():
            raise HandoverError(f"supervisorctl {command} failed (exit {done.returncode}): {text}; is supervisord "
                                "running? (RunPod images start it with --handover exec)")
    return "\n".join(output)


RELOAD_LINE = re.compile(r"^(\S+): (available|changed|disappeared)$")


def reread(settings: Settings) -> dict[str, str]:
    """`supervisorctl reread`: which program groups the files on disk add, change or drop
    (name -> available|changed|disappeared), without acting on any."""
    done = supervisorctl(settings, "reread")
    text = (done.stdout + done.stderr).strip()
    if done.returncode != 0 or "refused connection" in text or "no such file" in text.lower():
        raise HandoverError(f"supervisorctl reread failed (exit {done.returncode}): {text}; is supervisord running?")
    return {m.group(1): m.group(2) for line in text.splitlines() if (m := RELOAD_LINE.match(line.strip()))}


def update_groups(settings: Settings, groups: Iterable[str]) -> str:
    """`supervisorctl update GROUP...`: add, restart or remove exactly these groups (none: no call)."""
    names = sorted(groups)
    if not names:
        return ""
    done = supervisorctl(settings, "update", *names)
    text = (done.stdout + done.stderr).strip()
    if done.returncode != 0 or "refused connection" in text or any(
            line.startswith("ERROR") for line in text.splitlines()):
        raise HandoverError(f"supervisorctl update {' '.join(names)} failed (exit {done.returncode}): {text}")
    return text


def update_later(settings: Settings, group: str) -> None:
    """Start `supervisorctl update GROUP` in its own session and do not wait for it: the box agent's
    way to have its own program restarted or removed (supervisord stops the agent, the update goes on)."""
    try:
        subprocess.Popen([*_ctl_base(settings), "update", group], stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    except OSError as exc:
        raise HandoverError(f"cannot run supervisorctl: {exc.strerror}") from None


@contextmanager
def install_lock(settings: Settings, wait_s: float, poll_s: float = 0.5) -> Iterator[None]:
    """Hold the box's install lock (an flock on a file in the state dir); HandoverError when another
    installer or the box agent still holds it after `wait_s` seconds."""
    path = settings.install_lock_path
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise LockBusyError(f"another install (the installer or the box agent) holds {path}; "
                                        f"waited {wait_s:g} s") from None
                time.sleep(poll_s)
        yield
    finally:
        os.close(fd)  # releases the lock


@dataclass(frozen=True)
class ProgramStatus:
    """One program as `supervisorctl status` shows it: its state name (RUNNING, STARTING, BACKOFF,
    EXITED, FATAL...) and, while RUNNING, its pid (`pid 1234, uptime 0:00:05`); a new pid is a new process."""

    state: str
    pid: int | None = None


STATUS_PID = re.compile(r"\bpid (\d+),")


def program_status(settings: Settings, programs: Iterable[str]) -> dict[str, ProgramStatus]:
    """How supervisord shows each program; absent: not known (no such program, or no answer)."""
    names = list(programs)
    if not names:
        return {}
    done = supervisorctl(settings, "status", *names)
    found = {}
    for line in done.stdout.splitlines():
        fields = line.split(None, 2)
        if len(fields) >= 2 and fields[0] in names:
            pid = STATUS_PID.search(fields[2]) if len(fields) == 3 and fields[1] == "RUNNING" else None
            found[fields[0]] = ProgramStatus(fields[1], int(pid.group(1)) if pid else None)
    return found


def program_states(settings: Settings, programs: Iterable[str]) -> dict[str, str]:
    """Supervisor's state name (RUNNING, STARTING, FATAL...) for each program; absent: not known."""
    return {name: status.state for name, status in program_status(settings, programs).items()}


def supervisord_environment(environ: dict[str, str]) -> dict[str, str]:
    """What supervisord (and so every vLLM) inherits: everything but the fleet key."""
    return {k: v for k, v in environ.items() if k not in SECRET_VARS}


def exec_supervisord(settings: Settings) -> None:
    """Become `supervisord -n` (the RunPod container's main process). Does not return."""
    argv = ["supervisord", "-n"]
    if settings.supervisor_config is not None:
        argv += ["-c", str(settings.supervisor_config)]
    try:
        os.execvpe(argv[0], argv, supervisord_environment(dict(os.environ)))  # noqa: S606
    except OSError as exc:
        raise HandoverError(f"cannot exec supervisord: {exc.strerror}") from None
