"""What the workers of one gateway share (docs: gateway/README.md, "Workers").

The master makes it before it forks a generation of workers, so every worker of the generation (and of
every later one) inherits it: each model's slots, a process-shared semaphore per limited model, so its
limit holds across the workers exactly; and the metric tables, one per generation, in shared memory,
that any worker sums when it answers /metrics.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from fleetllm_gateway.limiter import SharedSlots
from fleetllm_gateway.metrics import Table


@dataclass(frozen=True)
class Shared:
    worker: int  # this worker's index in its generation (its cells of tables[-1])
    tables: tuple[Table, ...]  # every generation's, the newest (this worker's) last
    slots: Mapping[str, SharedSlots]  # model -> its slots, for the models with a limit
