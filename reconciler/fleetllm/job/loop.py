"""Running passes: the single-flight lock, structured pass logs, and the scheduled loop.

Passes run every interval plus jitter (fleetllm.core.schedule.next_delay). Between passes the loop asks
`wake()` every SYNC_POLL_S whether a pass is wanted now (a sync request taken from the state store:
`fleetllm sync`, POST /admin/sync, the pages' Sync now), and if so runs it.

The lock is the state store's (`store.pass_lock()`): with PostgreSQL an advisory lock, which holds
across replicas and machines; with SQLite (or no store) an exclusive `flock` on a file, which holds
across processes on one machine (cron, a systemd timer and a manual `fleetllm apply` never run two
passes at once). A pass that finds it held is skipped with a `reconcile_pass_skipped` log line naming
the lock (and its holder, when known).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable, Callable

from fleetllm.adapters.state.locks import file_lock as pass_lock
from fleetllm.adapters.state.passes import PassRecord
from fleetllm.core.schedule import next_delay
from fleetllm.errors import LockHeld
from fleetllm.job.metrics import PassMetrics
from fleetllm.logs import get_logger, log_event
from fleetllm_contract.logfmt import iso_utc

__all__ = ["LOG", "LockHeld", "log_pass", "pass_lock", "run_forever"]

LOG = get_logger("reconcile")
SYNC_POLL_S = 1.0  # how often the loop looks for a sync request while it waits


def log_pass(record: PassRecord) -> None:
    data = record.to_json()
    data["started_at"] = iso_utc(record.started_at)  # the log's own time format; the stored record keeps epoch
    log_event(LOG, "reconcile_pass", logging.INFO if record.ok else logging.ERROR, ok=record.ok, **data)


async def wait_for_next(stop: asyncio.Event, delay_s: float, wake: Callable[[], bool] | None = None) -> None:
    """Until `delay_s` has passed, `stop` is set, or `wake()` (asked every SYNC_POLL_S) says a pass is
    wanted now. A `wake` that fails is logged and the wait goes on."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + delay_s
    failing = False
    while not stop.is_set():
        remaining = deadline - loop.time()
        if remaining <= 0:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=min(remaining, SYNC_POLL_S) if wake else remaining)
        if wake is None or stop.is_set():
            continue
        try:
            if wake():
                return
            failing = False
        except Exception as exc:  # the state store may be down for a while: the schedule goes on
            if not failing:
                log_event(LOG, "sync_check_failed", logging.WARNING, error=f"{type(exc).__name__}: {exc}")
            failing = True


async def run_forever(one_pass: Callable[[], Awaitable[object]], interval_s: Callable[[], float],
                      metrics: PassMetrics | None = None, wake: Callable[[], bool] | None = None) -> int:
    """Run passes until SIGTERM/SIGINT; a failing pass is logged and the loop goes on. `wake`: asked
    while waiting whether to run the next pass now (fleetllm sync)."""
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
        await wait_for_next(stop, next_delay(interval_s()), wake)
    log_event(LOG, "reconcile_stopped")
    return 0
