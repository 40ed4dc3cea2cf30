"""Running passes: the single-flight lock, structured pass logs, and the scheduled loop.

The lock is an exclusive `flock` on a file, so it also holds across processes on one machine (cron, a
systemd timer and a manual `llmfleet apply` never run two passes at once); a pass that finds it held
is skipped with a log line. The scale issue replaces it with a PostgreSQL advisory lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import random
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import IO, Any

from reconciler.reconcile.metrics import PassMetrics
from reconciler.reconcile.store import PassRecord

LOG = logging.getLogger("llmfleet.reconcile")


class LockHeld(Exception):  # noqa: N818 (a state, not an error)
    pass


@contextlib.contextmanager
def pass_lock(path: str | Path) -> Iterator[None]:
    """Non-blocking exclusive lock for one pass; LockHeld when another process holds it."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    handle: IO[str] = open(path, "a+")  # noqa: SIM115 (held for the pass)
    try:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LockHeld(f"another reconcile pass holds {path}") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        yield
    finally:
        handle.close()  # closing releases the lock


def default_lock_path(state_url: str | None) -> str:
    if state_url and state_url.startswith("sqlite:///"):
        return state_url[len("sqlite:///"):] + ".reconcile.lock"
    base = os.environ.get("XDG_RUNTIME_DIR") or "/tmp"  # noqa: S108 (a lock file, not data)
    return os.path.join(base, f"llmfleet-reconcile-{os.getuid()}.lock")


def log_event(event: str, **fields: Any) -> None:
    """One structured line per event, on stderr (no secret is ever passed in)."""
    line = json.dumps({"ts": round(time.time(), 3), "event": event, **fields}, default=str, sort_keys=False)
    print(line, file=sys.stderr, flush=True)


def log_pass(record: PassRecord) -> None:
    data = record.to_json()
    log_event("reconcile_pass", ok=record.ok, **data)


def next_delay(interval_s: float, rng: random.Random | None = None) -> float:
    """The interval plus up to 10% jitter, so many reconcilers never beat in step."""
    return interval_s + (rng or random.Random()).uniform(0, interval_s * 0.1)  # noqa: S311 (jitter)


async def run_forever(one_pass: Callable[[], Awaitable[int]], interval_s: Callable[[], float],
                      metrics: PassMetrics | None = None) -> int:
    """Run passes until SIGTERM/SIGINT; a failing pass is logged and the loop goes on."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    while not stop.is_set():
        try:
            await one_pass()
        except Exception as exc:  # a bug or an unexpected failure must not end the scheduled job
            log_event("reconcile_pass_crashed", error=f"{type(exc).__name__}: {exc}")
            if metrics is not None:
                metrics.passes.labels("crashed").inc()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=next_delay(interval_s()))
    log_event("reconcile_stopped")
    return 0
