"""Per-model Prometheus metrics, kept in plain counters and rendered in the text exposition format.

Standard library only (the gateway runs from the box zipapp, where prometheus-client is not
installed). Served at GET /metrics, behind the bearer like every route but /health.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping

# Seconds: from sub-millisecond local answers to minutes-long generations.
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
PREFIX = "fleetllm_gateway"


class Histogram:
    __slots__ = ("count", "counts", "total")

    def __init__(self) -> None:
        self.counts = [0] * (len(BUCKETS) + 1)  # the last one is +Inf only
        self.count = 0
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(BUCKETS, seconds)] += 1
        self.count += 1
        self.total += seconds


class ModelStats:
    __slots__ = ("duration", "latency", "limit", "requests", "upstream_errors")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.requests: dict[int, int] = {}  # status code -> count
        self.upstream_errors = 0
        self.latency = Histogram()  # request sent upstream -> its response headers
        self.duration = Histogram()  # request admitted -> last byte to the client

    def count(self, status: int) -> None:
        self.requests[status] = self.requests.get(status, 0) + 1


class Metrics:
    def __init__(self, model_limits: Iterable[tuple[str, int]]) -> None:
        self.models = {name: ModelStats(limit) for name, limit in model_limits}
        self.unrouted: dict[int, int] = {}  # status code -> count, for requests no model was chosen for

    def count_unrouted(self, status: int) -> None:
        self.unrouted[status] = self.unrouted.get(status, 0) + 1

    def render(self, live: Mapping[str, tuple[int, int]]) -> str:
        """The exposition text; `live` maps a model to its (in flight, queued) counts right now."""
        out: list[str] = []

        def family(name: str, kind: str, help_text: str) -> str:
            full = f"{PREFIX}_{name}"
            out.append(f"# HELP {full} {help_text}")
            out.append(f"# TYPE {full} {kind}")
            return full

        items = sorted(self.models.items())
        name = family("requests_total", "counter", "Requests routed to a model, by response status code.")
        for model, stats in items:
            out.extend(f'{name}{{model="{_label(model)}",code="{code}"}} {n}'
                       for code, n in sorted(stats.requests.items()))
        name = family("requests_in_flight", "gauge", "Requests holding a concurrency slot of the model.")
        out.extend(f'{name}{{model="{_label(model)}"}} {live.get(model, (0, 0))[0]}' for model, _ in items)
        name = family("requests_queued", "gauge", "Requests waiting for a concurrency slot of the model.")
        out.extend(f'{name}{{model="{_label(model)}"}} {live.get(model, (0, 0))[1]}' for model, _ in items)
        name = family("concurrency_limit", "gauge", "Concurrency slots of the model (0: unlimited).")
        out.extend(f'{name}{{model="{_label(model)}"}} {stats.limit}' for model, stats in items)
        name = family("upstream_errors_total", "counter",
                      "Upstream connections or exchanges that failed (answered 502 or cut short).")
        out.extend(f'{name}{{model="{_label(model)}"}} {stats.upstream_errors}' for model, stats in items)
        for attr, metric, help_text in (
                ("latency", "upstream_latency_seconds", "From sending the request upstream to its response headers."),
                ("duration", "request_duration_seconds", "From admission to the last byte sent to the client.")):
            name = family(metric, "histogram", help_text)
            for model, stats in items:
                _histogram(out, name, f'model="{_label(model)}"', getattr(stats, attr))
        name = family("unrouted_requests_total", "counter",
                      "Requests answered before a model was chosen (401, 400, 404, 413), by status code.")
        out.extend(f'{name}{{code="{code}"}} {n}' for code, n in sorted(self.unrouted.items()))
        return "\n".join(out) + "\n"


def _histogram(out: list[str], name: str, labels: str, histogram: Histogram) -> None:
    cumulative = 0
    for bound, n in zip(BUCKETS, histogram.counts, strict=False):
        cumulative += n
        out.append(f'{name}_bucket{{{labels},le="{bound}"}} {cumulative}')
    out.append(f'{name}_bucket{{{labels},le="+Inf"}} {histogram.count}')
    out.append(f"{name}_sum{{{labels}}} {histogram.total}")
    out.append(f"{name}_count{{{labels}}} {histogram.count}")


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
