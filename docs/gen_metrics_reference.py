#!/usr/bin/env python3
"""Generate docs/metrics.md from the Prometheus registries of the control plane and the reconciler.

    python3 docs/gen_metrics_reference.py           # rewrite docs/metrics.md
    python3 docs/gen_metrics_reference.py --check   # exit 1 if it is stale (tests/deploy/test_metrics_docs.py)

`make docs` runs the first. The metrics are read from the code, not from its text: the control plane's
`Metrics()` and the reconciler's `PassMetrics()` are instantiated and every metric they register is
listed with its type, labels and help text. tests/deploy/ checks the alert rules and the Grafana dashboard
against the same list (`exported()`).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase

from fleetllm.adapters.forge import ForgeMetrics
from fleetllm.adapters.notify import NotifyMetrics
from fleetllm.adapters.state.records import BoxApi
from fleetllm.core.judge.plan import ActionKind
from fleetllm.core.judge.verdict import Verdict
from fleetllm.core.notify import EventKind
from fleetllm.job.metrics import PassMetrics
from fleetllm.server.guard import Refusal
from fleetllm.server.metrics import Metrics
from fleetllm_contract.report import ReportOutcome

sys.path.insert(0, str(Path(__file__).resolve().parent))  # docgen.py beside this file, however it is loaded
from docgen import write_or_check

ROOT = Path(__file__).resolve().parent.parent
TARGET = ROOT / "docs" / "metrics.md"


@dataclass(frozen=True)
class Family:
    name: str  # the family's name (a counter's series end in _total)
    kind: str  # counter | gauge
    labels: tuple[str, ...]
    help: str
    source: str  # which process exports it

    @property
    def series(self) -> str:
        """The name a query uses."""
        return f"{self.name}_total" if self.kind == "counter" else self.name


@dataclass(frozen=True)
class Source:
    key: str
    title: str
    where: str


SOURCES = (
    Source("control-plane", "Control plane", "`fleetllm serve`, at `GET /metrics` (for the bearer `metrics_token` "
           "only, where it is set: the series name every box and pod; without it, public). Each replica "
           "exports its own; the `fleetllm_box_last_*` and `fleetllm_unknown_*` "
           "series are read from the shared state store (at most once every 30 s; scrapes between reuse the "
           "read), so every replica shows the same."),
    Source("reconciler", "Reconciler", "`fleetllm reconcile --metrics-listen HOST:PORT` (`/metrics`, the "
           "long-running loop; behind `metrics_token` as the control plane's, `/health/live` for probes). A "
           "batch `fleetllm reconcile --once` (the CronJob, the systemd timer) hands each "
           "pass's metrics over when the pass ends: a PUT to a Pushgateway (`reconcile.pushgateway` in the "
           "config: the group `job=\"fleetllm_reconcile\"`, `instance=` its instance, replaced by the next pass; "
           "scrape the Pushgateway with `honor_labels: true`), and/or a file for node_exporter's textfile "
           "collector (`reconcile.metrics_file`, or `--metrics-file FILE`, which `apply` takes too), written "
           "atomically. A pass that ran hands over, with or without errors, suspended or in a dry run; a pass "
           "skipped because another held the pass lock, or one that could not run, hands over nothing (the "
           "last one stays exported, and `FleetllmReconcilePassOverdue` fires when passes stop). A failed "
           "push or write is logged (`metrics_push_failed`, `metrics_file_failed`) and never changes the exit "
           "status. Values are of the last pass this process ran: a `--once` run's counters count that one "
           "pass, so rely on the gauges (timestamps, last-pass values) rather than on rate() of a counter; "
           "`fleetllm_reconcile_last_success_timestamp_seconds` of a failed `--once` pass is the fleet's last "
           "success read from the state store's pass records (the newest of the last 50)."),
    Source("notifications", "Notifications", "both: the control plane and the reconciler each register the "
           "outgoing notifier's metrics in their own registry (docs/notifications.md); a process without "
           "`notifications.targets` exports them at zero."),
    Source("forge", "Commit statuses", "the reconciler, when the config has a `forge` section (the fleet "
           "repository's commit statuses: docs/runbooks.md); in its registry beside the pass metrics, handed over "
           "the same way."),
)


def values(enum: type[StrEnum]) -> str:
    return ", ".join(f"`{member.value}`" for member in enum)


# What each label holds, per family (the enums are the code's own, so their values stay current). A label
# without an entry here stops the generator: every label is explained.
LABELS: dict[tuple[str, str], str] = {
    ("fleetllm_box_requests", "endpoint"): f"the box endpoint: {values(BoxApi)}",
    ("fleetllm_box_requests", "status"): "the HTTP status answered: `200`, `304`, `400`, `403` (no or a wrong "
                                         "fleet key), `404` (a box the placement does not have), `413`, `503`",
    ("fleetllm_served_revision_info", "revision"): "the commit served",
    ("fleetllm_box_reports", "outcome"): f"what the installer run ended with: {values(ReportOutcome)}",
    ("fleetllm_weak_secret", "secret"): "`vllm_api_salt`",
    ("fleetllm_http_connections_refused", "reason"): f"the cap: {values(Refusal)}",
    ("fleetllm_login_refused", "reason"): "`wrong_token`, `rate_limited`, `sso_refused` (a single sign-on refused: "
                                          "its answer, its ID token or the person's groups)",
    ("fleetllm_box_last_config_timestamp_seconds", "box"): "a box of the served revision (its placement name)",
    ("fleetllm_box_last_report_timestamp_seconds", "box"): "a box of the served revision (its placement name)",
    ("fleetllm_box_stale_servers", "box"): "the box's placement name",
    ("fleetllm_reconcile_passes", "outcome"): "`ok`, `error` (observation errors or a failed write), `crashed` "
                                              "(the pass raised; the loop went on)",
    ("fleetllm_reconcile_actions", "kind"): values(ActionKind),
    ("fleetllm_reconcile_actions", "result"): "`ok`, `failed`, `planned` (a dry run), "
                                             "`suspended` (a pass while the fleet is suspended: not written)",
    ("fleetllm_servers", "verdict"): f"{values(Verdict)} ([concepts.md](concepts.md#verdicts))",
    ("fleetllm_model_intended_servers", "model"): "the model's name in models.yaml",
    ("fleetllm_model_serving_servers", "model"): "the model's name in models.yaml",
    ("fleetllm_box_cost_per_hour", "box"): "the box's placement name (only boxes a listing priced)",
    ("fleetllm_model_cost_per_hour", "model"): "the model's name in models.yaml",
    ("fleetllm_capacity_actions", "kind"): "`rent`, `terminate`",
    ("fleetllm_capacity_actions", "result"): "`ok`, `failed` (tried again after a back-off)",
    **{(f"fleetllm_notifications_{name}", "target"): "the target's `name` in `notifications.targets`"
       for name in ("sent", "failed", "retries")},
    **{(f"fleetllm_notifications_{name}", "kind"): values(EventKind) for name in ("sent", "failed", "deduplicated")},
    **{(f"fleetllm_commit_statuses_{name}", "state"): "`pending`, `success`, `failure`, `error`"
       for name in ("sent", "failed")},
    # Agreed with the rollout engine (ROLLOUT-DESIGN.md), which defines it.
    ("fleetllm_rollout_boxes", "state"): "`released`, `applied`, `waiting`, `halted`",
}


def registries() -> Iterator[tuple[Source, object, CollectorRegistry]]:
    """The real registries: one control plane's and one reconciler's, as the processes build them."""
    server, job = Metrics(), PassMetrics()
    yield SOURCES[0], server, server.registry
    yield SOURCES[1], job, job.registry
    registry = CollectorRegistry()
    yield SOURCES[2], NotifyMetrics(registry), registry
    forge = CollectorRegistry()
    yield SOURCES[3], ForgeMetrics(forge), forge


def families_of(source: Source, holder: object, registry: CollectorRegistry) -> list[Family]:
    """Every family `registry` exports, with its labels. Names, types and help come from the registry's
    own collect(); labels (which collect() gives only for series that exist) from the metric objects the
    holder keeps. A family the holder does not keep as an attribute is an error, so none is left out."""
    labels: dict[str, tuple[str, ...]] = {}
    for value in vars(holder).values():
        if isinstance(value, MetricWrapperBase):
            for metric in value.describe():
                labels[metric.name] = tuple(value._labelnames)  # prometheus_client keeps them there
        elif callable(getattr(value, "describe", None)) and not isinstance(value, CollectorRegistry):
            for metric in value.describe():
                labels[metric.name] = tuple(getattr(metric, "_labelnames", ()))
    found = []
    for metric in registry.collect():
        if metric.name not in labels:
            raise SystemExit(f"{metric.name}: registered but not an attribute of {type(holder).__name__}")
        found.append(Family(metric.name, metric.type, labels[metric.name], " ".join(metric.documentation.split()),
                            source.key))
    return sorted(found, key=lambda f: f.name)


def exported() -> list[Family]:
    """Every metric family the control plane and the reconciler export."""
    return [family for source, holder, registry in registries() for family in families_of(source, holder, registry)]


HEADER = """\
# Metrics reference

<!-- Generated by docs/gen_metrics_reference.py from the metrics registries in the code: do not edit by
     hand. Change a metric's help text in reconciler/fleetllm/server/metrics.py or job/metrics.py, then run
     `make docs`. A test fails while this file is stale. -->

Every metric the control plane and the reconciler export, with its labels. The alert rules in
[`deploy/prometheus/fleetllm.rules.yml`](../deploy/prometheus/fleetllm.rules.yml) (what each alert means and
what to do: [runbooks.md](runbooks.md#alerts)) and the Grafana dashboard in
[`deploy/grafana/fleetllm.json`](../deploy/grafana/fleetllm.json) use only these; a test checks it.

Counters are listed by the name queries use (`…_total`). Times are Unix seconds; a timestamp of 0 means
"never" (or not within what the state store keeps). Prometheus adds `job` and `instance` to each series.
"""


def label_text(family: Family) -> str:
    parts = []
    for label in family.labels:
        if (family.name, label) not in LABELS:
            raise SystemExit(f"{family.name}: label {label!r} has no entry in LABELS of {Path(__file__).name}")
        parts.append(f"`{label}`: {LABELS[(family.name, label)]}")
    return "; ".join(parts)


def cell(text: str) -> str:
    return text.replace("|", "\\|")


def render() -> str:
    families = exported()
    parts = [HEADER]
    for source in SOURCES:
        own = [f for f in families if f.source == source.key]
        parts.append(f"\n## {source.title}\n\nExported by {source.where}\n\n"
                     "| Metric | Type | Labels | What it measures |\n|---|---|---|---|\n")
        parts.extend(f"| `{f.series}` | {f.kind} | {cell(label_text(f)) or '–'} | {cell(f.help)} |\n" for f in own)
    return "".join(parts)


def main(argv: list[str] | None = None) -> int:
    return write_or_check(TARGET, render, (__doc__ or "").splitlines()[0], argv)


if __name__ == "__main__":
    sys.exit(main())
