"""Prometheus metrics of one control plane, in a registry of its own (an app per test stays separate)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, disable_created_metrics, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from fleetllm.core.control import ControlState
from fleetllm.logs import get_logger, log_event

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
log = get_logger("metrics")


@dataclass(frozen=True)
class BoxTimes:
    """What the box freshness series are made of, read at scrape time."""

    boxes: Collection[str]  # the served revision's boxes (only these get series: no label from a request)
    config: Mapping[str, float] = field(default_factory=dict)  # box -> last GET /vllm/config answered 200 or 304
    report: Mapping[str, float] = field(default_factory=dict)  # box -> last POST /vllm/report recorded
    unknown: int = 0  # attention entries whose name the served revision does not place
    unknown_last_seen: float = 0.0  # the newest of their sightings


class BoxFreshness(Collector):
    """Per box of the served revision, when it last got its config and last reported, and the unknown boxes
    of the attention list, read from the state store at each scrape (so the series survive a restart and
    cover every replica sharing the store). A box with no such record on file (never, or not within the
    fetch log's retention) reads 0."""

    CONFIG = ("fleetllm_box_last_config_timestamp_seconds", "When a GET /vllm/config of the box was last answered "
              "200 or 304 (a boot fetch or an agent's poll; any replica); 0: never, within the fetch log's "
              "retention.")
    REPORT = ("fleetllm_box_last_report_timestamp_seconds", "When the box last reported (POST /vllm/report); 0: "
              "never, within the kept reports.")

    UNKNOWN = ("fleetllm_unknown_boxes", "Unknown boxes in the attention list (they presented the fleet key for a "
               "name the served revision does not place).")
    UNKNOWN_SEEN = ("fleetllm_unknown_box_last_seen_timestamp_seconds", "When an unknown box last presented the "
                    "fleet key (any replica); 0: none on file.")

    def __init__(self, max_age_s: float = 30.0) -> None:
        self.source: Callable[[], BoxTimes] | None = None
        # Scrapes within max_age_s of a read reuse it: several Prometheus servers may scrape each replica, and
        # each read is three queries on the shared store (the fetch log's part is box_last_fetch: about 2 ms
        # at 1,000 boxes and 200,000 records on SQLite; it scanned the log, 80-270 ms, before migration 11).
        self.max_age_s = max_age_s
        self._last: tuple[float, BoxTimes] | None = None
        self._lock = threading.Lock()

    def read(self) -> BoxTimes:
        with self._lock:
            now = time.monotonic()
            if self._last is None or now - self._last[0] >= self.max_age_s:
                assert self.source is not None
                self._last = (now, self.source())
            return self._last[1]

    def families(self) -> tuple[GaugeMetricFamily, ...]:
        # The unknown boxes are counted, never labelled: their names are chosen by whoever sends the request.
        return (GaugeMetricFamily(*self.CONFIG, labels=["box"]), GaugeMetricFamily(*self.REPORT, labels=["box"]),
                GaugeMetricFamily(*self.UNKNOWN), GaugeMetricFamily(*self.UNKNOWN_SEEN))

    def describe(self) -> Iterator[Metric]:
        yield from self.families()

    def collect(self) -> Iterator[Metric]:
        config, report, unknown, unknown_seen = self.families()
        if self.source is not None:
            try:
                times = self.read()
            except Exception as exc:  # a store outage must not fail the whole scrape (its text is not logged:
                # a driver's message may carry connection details)
                log_event(log, "box freshness unavailable", logging.WARNING, error=type(exc).__name__)
            else:
                for box in sorted(times.boxes):
                    config.add_metric([box], times.config.get(box, 0.0))
                    report.add_metric([box], times.report.get(box, 0.0))
                unknown.add_metric([], times.unknown)
                unknown_seen.add_metric([], times.unknown_last_seen)
        yield from (config, report, unknown, unknown_seen)


class Metrics:
    def __init__(self) -> None:
        disable_created_metrics()  # type: ignore[no-untyped-call]  # *_created series only add noise
        self.registry = CollectorRegistry()
        r = self.registry
        self.box_requests = Counter("fleetllm_box_requests", "Box requests by endpoint and HTTP status.",
                                    ["endpoint", "status"], registry=r)
        self._box_request_series: dict[tuple[str, int], Counter] = {}
        self.served_revision = Gauge("fleetllm_served_revision_info", "1 for the fleet revision being served.",
                                     ["revision"], registry=r)
        self.served_boxes = Gauge("fleetllm_served_boxes", "Boxes in the served revision.", registry=r)
        self.served_servers = Gauge("fleetllm_served_servers", "vLLM servers in the served revision.", registry=r)
        self.last_refresh = Gauge("fleetllm_git_last_successful_refresh_timestamp_seconds",
                                  "When the tracked branch was last read without error.", registry=r)
        self.refresh_errors = Counter("fleetllm_git_refresh_errors", "Failed fetches or reads of the tracked "
                                      "branch.", registry=r)
        self.validation_failures = Counter("fleetllm_commit_validation_failures", "Commits that failed "
                                           "validation (each counted once).", registry=r)
        self.last_attempted_valid = Gauge("fleetllm_last_attempted_revision_valid", "1 when the branch head is "
                                          "valid, 0 when an invalid head is being held back.", registry=r)
        self.attention_entries = Gauge("fleetllm_attention_entries", "Entries of the attention list (boxes that "
                                       "presented the fleet key while unknown; approved ones included).", registry=r)
        self.attention_evicted = Counter("fleetllm_attention_evicted", "Attention entries dropped at the cap.",
                                         registry=r)
        self.box_reports = Counter("fleetllm_box_reports", "Box reports received, by outcome.", ["outcome"],
                                   registry=r)
        self.weak_secrets = Gauge("fleetllm_weak_secret", "1 for a secret that works but is weak (vllm_api_salt: "
                                  "shorter than 16 characters), 0 otherwise.", ["secret"], registry=r)
        self.connections_open = Gauge("fleetllm_http_connections_open", "Open client connections.", registry=r)
        self.connections_refused = Counter("fleetllm_http_connections_refused", "Connections or bodies refused "
                                           "at a cap (per_peer, per_prefix, total, body_budget).", ["reason"],
                                           registry=r)
        self.login_refused = Counter("fleetllm_login_refused", "Login attempts refused (wrong token, rate "
                                     "limited, or a single sign-on refused).", ["reason"], registry=r)
        self.box_freshness = BoxFreshness()
        r.register(self.box_freshness)
        self.suspended = Gauge("fleetllm_suspended", "1 while the fleet is suspended (fleetllm suspend): passes "
                               "observe and record, act on nothing.", registry=r)
        self.pinned = Gauge("fleetllm_pinned", "1 while the fleet is pinned to a revision (fleetllm pin).",
                            registry=r)
        self.sync_pending = Gauge("fleetllm_sync_requested", "1 while a sync request waits for a reconcile loop.",
                                  registry=r)
        self._revision: str | None = None

    def count_box_request(self, endpoint: str, status: int, count: int = 1) -> None:
        """`count` box requests answered `status`: their series of fleetllm_box_requests, looked up once per
        pair (Counter.labels takes the metric's lock and builds its key on every call)."""
        series = self._box_request_series.get((endpoint, status))
        if series is None:
            series = self._box_request_series[(endpoint, status)] = self.box_requests.labels(endpoint, str(status))
        series.inc(count)

    def control(self, state: ControlState) -> None:
        self.suspended.set(1 if state.suspended else 0)
        self.pinned.set(1 if state.pin else 0)
        self.sync_pending.set(1 if state.sync else 0)

    def serve_revision(self, revision: str, boxes: int, servers: int) -> None:
        if self._revision is not None:
            self.served_revision.remove(self._revision)
        self.served_revision.labels(revision).set(1)
        self._revision = revision
        self.served_boxes.set(boxes)
        self.served_servers.set(servers)

    def watch_boxes(self, source: Callable[[], BoxTimes]) -> None:
        """Read the box freshness series from `source` at each scrape."""
        self.box_freshness.source = source

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
