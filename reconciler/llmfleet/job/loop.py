"""Running passes: the single-flight lock, structured pass logs, and the scheduled loop.

The lock is the state store's (`store.pass_lock()`): with PostgreSQL an advisory lock, which holds
across replicas and machines; with SQLite (or no store) an exclusive `flock` on a file, which holds
across processes on one machine (cron, a systemd timer and a manual `llmfleet apply` never run two
passes at once). A pass that finds it held is skipped with a `reconcile_pass_skipped` log line naming
the lock (and its holder, when known).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import signal
from collections.abc import Awaitable, Callable

from llmfleet.adapters.state.locks import file_lock as pass_lock
from llmfleet.adapters.state.passes import PassRecord
from llmfleet.errors import LockHeld
from llmfleet.job.metrics import PassMetrics
from llmfleet.logs import get_logger, log_event
from llmfleet_contract.logfmt import iso_utc

__all__ = ["LOG", "LockHeld", "log_pass", "next_delay", "pass_lock", "run_forever"]

LOG = get_logger("reconcile")


def log_pass(record: PassRecord) -> None:
    data = record.to_json()
    data["started_at"] = iso_utc(record.started_at)  # the log's own time format; the stored record keeps epoch
    log_event(LOG, "reconcile_pass", logging.INFO if record.ok else logging.ERROR, ok=record.ok, **data)


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
            log_event(LOG, "reconcile_pass_crashed", logging.ERROR, error=f"{type(exc).__name__}: {exc}")
            if metrics is not None:
                metrics.passes.labels("crashed").inc()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=next_delay(interval_s()))
    log_event(LOG, "reconcile_stopped")
    return 0
