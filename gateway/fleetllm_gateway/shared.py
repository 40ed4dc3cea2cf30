"""What the workers of one gateway share (docs: gateway/README.md, "Workers").

The master makes it before it forks a generation of workers, so every worker of the generation (and of
every later one) inherits it: each model's slots, a process-shared semaphore per limited model, so its
limit holds across the workers exactly; the request-body bytes they hold (one budget); and the metric
tables, one per generation, in shared memory, that any worker sums when it answers /metrics.
"""

from __future__ import annotations

import ctypes
import mmap
from collections.abc import Mapping
from dataclasses import dataclass
from multiprocessing.context import BaseContext

from fleetllm_gateway.limiter import SharedBytes, SharedSlots
from fleetllm_gateway.metrics import Table


class BodyBytes:
    """The request-body bytes every worker holds (the gateway-wide maxBufferedBytes): one counter in
    shared memory, changed under a process-shared lock held for a compare and an add."""

    def __init__(self, context: BaseContext) -> None:
        self._lock = context.Lock()
        self._map = mmap.mmap(-1, ctypes.sizeof(ctypes.c_int64))
        self._held = ctypes.c_int64.from_buffer(self._map)

    def take(self, amount: int, total: int) -> bool:
        with self._lock:
            if self._held.value + amount > total:
                return False
            self._held.value += amount
            return True

    def give(self, amount: int) -> None:
        with self._lock:
            self._held.value -= amount


@dataclass(frozen=True)
class Shared:
    worker: int  # this worker's index in its generation (its cells of tables[-1])
    tables: tuple[Table, ...]  # every generation's, the newest (this worker's) last
    slots: Mapping[str, SharedSlots]  # model -> its slots, for the models with a limit
    body_bytes: SharedBytes  # request-body bytes held by every worker
