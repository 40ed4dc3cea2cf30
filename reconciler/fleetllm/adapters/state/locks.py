"""Single-flight locks for reconcile passes: a file lock for one machine (SQLite, or no store);
postgres.py holds a PostgreSQL advisory lock instead, which holds across machines."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from fleetllm.errors import LockHeld

__all__ = ["LockHeld", "default_lock_path", "file_lock"]




@contextlib.contextmanager
def file_lock(path: str | Path) -> Iterator[None]:
    """Non-blocking exclusive `flock`; LockHeld when another process holds it. The holder's pid is
    written into the file for whoever looks."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    handle: IO[str] = open(path, "a+")  # noqa: SIM115 (held for the pass)
    try:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip()
            raise LockHeld(f"another reconcile pass holds {path}" + (f" (pid {holder})" if holder else "")) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        yield
    finally:
        handle.close()  # closing releases the lock


def default_lock_path(sqlite_file: Path | None) -> Path:
    """Beside the SQLite file; without one, in the user's runtime directory."""
    if sqlite_file is not None:
        return Path(f"{sqlite_file}.reconcile.lock")
    base = os.environ.get("XDG_RUNTIME_DIR") or "/tmp"  # noqa: S108 (a lock file, not data)
    return Path(base) / f"fleetllm-reconcile-{os.getuid()}.lock"
