"""Per-model Prometheus metrics, kept in plain counters and rendered in the text exposition format.

Standard library only (the gateway runs from the box zipapp, where prometheus-client is not
installed). Served at GET /metrics, behind the bearer like every route but /health.
"""

from __future__ import annotations

import bisect
import mmap
from collections.abc import Iterable, Sequence
from typing import cast

# Seconds: from sub-millisecond local answers to minutes-long generations.
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
PREFIX = "fleetllm_gateway"

# One worker's cells: the unrouted counts by status code, then a block per model. Every cell is a double
# (exact for counts below 2**53), written by its own worker only: no lock, and a scrape answered by any
# worker sums every worker's cells (of every generation a reload started: counters keep adding up).
CODES = 1000  # status codes 0-999, one cell each
_NB = len(BUCKETS) + 1  # bucket cells, the last one for +Inf only
_HIST = _NB + 2  # buckets, count, sum
ERRORS, ACTIVE, QUEUED, LATENCY = 0, 1, 2, 3
DURATION = LATENCY + _HIST
STATUS = DURATION + _HIST
MODEL_CELLS = STATUS + CODES
# After every worker's cells, a few per model that any worker writes: when an upstream failure of the
# model was last logged (time.monotonic(), the same clock in every process; 0: never) and how many went
# unlogged since, so the gateway logs one line per interval, not one per worker.
LAST_LOGGED, UNLOGGED = 0, 1
COMMON_CELLS = 2


class Table:
    """The metric cells of `workers` workers serving the models `names`, in one anonymous shared mapping:
    made before the workers are forked, every worker (and every later generation) sees all of it."""

    def __init__(self, names: Iterable[str], workers: int = 1) -> None:
        self.names = tuple(names)
        self.index = {name: i for i, name in enumerate(self.names)}
        self.workers = workers
        self.stride = CODES + len(self.names) * MODEL_CELLS
        size = workers * self.stride + len(self.names) * COMMON_CELLS
        self._map = mmap.mmap(-1, size * 8)  # MAP_SHARED | MAP_ANONYMOUS
        self.cells = memoryview(self._map).cast("d")

    def unrouted(self, worker: int) -> int:
        return worker * self.stride

    def model(self, worker: int, name: str) -> int:
        return worker * self.stride + CODES + self.index[name] * MODEL_CELLS

    def common(self, name: str) -> int:
        """The model's cells every worker writes (LAST_LOGGED, UNLOGGED)."""
        return self.workers * self.stride + self.index[name] * COMMON_CELLS

    def total(self, name: str | None, offset: int, count: int = 1) -> list[float]:
        """`count` cells from `offset` of the model's block (of the unrouted block when `name` is None),
        summed over the workers; zeros for a model this table does not have."""
        out = [0.0] * count
        if name is not None and name not in self.index:
            return out
        cells = self.cells
        for worker in range(self.workers):
            base = (self.unrouted(worker) if name is None else self.model(worker, name)) + offset
            # Doubles ("d"), whatever typeshed says of memoryview.tolist() (list[int]).
            out = [a + b for a, b in zip(out, cast("list[float]", cells[base:base + count].tolist()), strict=True)]
        return out


class Histogram:
    __slots__ = ("base", "cells")

    def __init__(self, cells: memoryview[float], base: int) -> None:
        self.cells = cells
        self.base = base

    def observe(self, seconds: float) -> None:
        cells, base = self.cells, self.base
        cells[base + bisect.bisect_left(BUCKETS, seconds)] += 1
        cells[base + _NB] += 1
        cells[base + _NB + 1] += seconds


class ModelStats:
    """One model's cells of this worker."""

    __slots__ = ("base", "cells", "common", "duration", "latency", "limit")

    def __init__(self, limit: int, cells: memoryview[float], base: int, common: int) -> None:
        self.limit = limit
        self.cells = cells
        self.base = base
        self.common = common
        self.latency = Histogram(cells, base + LATENCY)  # request sent upstream -> its response headers
        self.duration = Histogram(cells, base + DURATION)  # request admitted -> last byte to the client

    def count(self, status: int) -> None:
        self.cells[self.base + STATUS + min(max(status, 0), CODES - 1)] += 1

    def upstream_error(self) -> None:
        self.cells[self.base + ERRORS] += 1

    def live(self, active: int, queued: int) -> None:
        """This worker's slots held and requests queued right now (the gauges)."""
        self.cells[self.base + ACTIVE] = active
        self.cells[self.base + QUEUED] = queued


class Metrics:
    """This worker's metrics, written to its cells of `tables[-1]`, rendered as the sum over `tables`
    (every generation's table) and their workers, for the models of this configuration."""

    def __init__(self, model_limits: Iterable[tuple[str, int]], *, tables: Sequence[Table] = (),
                 worker: int = 0) -> None:
        limits = dict(model_limits)
        self.tables = tuple(tables) or (Table(sorted(limits)),)
        table = self.tables[-1]
        self.limits = limits
        self.models = {name: ModelStats(limit, table.cells, table.model(worker, name), table.common(name))
                       for name, limit in limits.items()}
        self._cells, self._unrouted = table.cells, table.unrouted(worker)

    def count_unrouted(self, status: int) -> None:
        self._cells[self._unrouted + min(max(status, 0), CODES - 1)] += 1

    def _sum(self, name: str | None, offset: int, count: int = 1) -> list[float]:
        out = [0.0] * count
        for table in self.tables:
            out = [a + b for a, b in zip(out, table.total(name, offset, count), strict=True)]
        return out

    def render(self) -> str:
        """The exposition text, summed over every worker."""
        out: list[str] = []

        def family(name: str, kind: str, help_text: str) -> str:
            full = f"{PREFIX}_{name}"
            out.append(f"# HELP {full} {help_text}")
            out.append(f"# TYPE {full} {kind}")
            return full

        models = sorted(self.limits)
        blocks = {model: self._sum(model, 0, MODEL_CELLS) for model in models}
        name = family("requests_total", "counter", "Requests routed to a model, by response status code.")
        for model in models:
            codes = blocks[model][STATUS:]
            out.extend(f'{name}{{model="{_label(model)}",code="{code}"}} {int(n)}' for code, n in enumerate(codes) if n)
        name = family("requests_in_flight", "gauge", "Requests holding a concurrency slot of the model.")
        out.extend(f'{name}{{model="{_label(model)}"}} {int(blocks[model][ACTIVE])}' for model in models)
        name = family("requests_queued", "gauge", "Requests waiting for a concurrency slot of the model.")
        out.extend(f'{name}{{model="{_label(model)}"}} {int(blocks[model][QUEUED])}' for model in models)
        name = family("concurrency_limit", "gauge", "Concurrency slots of the model (0: unlimited).")
        out.extend(f'{name}{{model="{_label(model)}"}} {self.limits[model]}' for model in models)
        name = family("upstream_errors_total", "counter",
                      "Upstream connections or exchanges that failed (answered 502 or cut short).")
        out.extend(f'{name}{{model="{_label(model)}"}} {int(blocks[model][ERRORS])}' for model in models)
        for offset, metric, help_text in (
                (LATENCY, "upstream_latency_seconds", "From sending the request upstream to its response headers."),
                (DURATION, "request_duration_seconds", "From admission to the last byte sent to the client.")):
            name = family(metric, "histogram", help_text)
            for model in models:
                _histogram(out, name, f'model="{_label(model)}"', blocks[model][offset:offset + _HIST])
        name = family("unrouted_requests_total", "counter",
                      "Requests answered before a model was chosen (401, 400, 404, 413), by status code.")
        unrouted = self._sum(None, 0, CODES)
        out.extend(f'{name}{{code="{code}"}} {int(n)}' for code, n in enumerate(unrouted) if n)
        return "\n".join(out) + "\n"


def _histogram(out: list[str], name: str, labels: str, cells: list[float]) -> None:
    """`cells`: the bucket counts (the last for +Inf only), the count, the sum."""
    cumulative = 0
    for bound, n in zip(BUCKETS, cells, strict=False):
        cumulative += int(n)
        out.append(f'{name}_bucket{{{labels},le="{bound}"}} {cumulative}')
    out.append(f'{name}_bucket{{{labels},le="+Inf"}} {int(cells[_NB])}')
    out.append(f"{name}_sum{{{labels}}} {cells[_NB + 1]}")
    out.append(f"{name}_count{{{labels}}} {int(cells[_NB])}")


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
