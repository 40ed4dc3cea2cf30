"""Prometheus metrics of reconcile passes (own registry: several reconcilers may share a process in tests)."""

from __future__ import annotations

from collections import Counter as Counter_

from prometheus_client import CollectorRegistry, Counter, Gauge, write_to_textfile

from llmfleet.adapters.state.passes import PassRecord, RolloutPassRecord
from llmfleet.core.judge.verdict import Verdict
from llmfleet.core.rollout.model import BoxState, RolloutState


class PassMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.passes = Counter("llmfleet_reconcile_passes", "Reconcile passes by outcome", ["outcome"], registry=r)
        self.skipped = Counter("llmfleet_reconcile_skipped", "Passes skipped: another pass held the lock",
                               registry=r)
        self.duration = Gauge("llmfleet_reconcile_last_pass_duration_seconds", "Duration of the last pass",
                              registry=r)
        self.last = Gauge("llmfleet_reconcile_last_pass_timestamp_seconds", "When the last pass started",
                          registry=r)
        self.last_ok = Gauge("llmfleet_reconcile_last_success_timestamp_seconds",
                             "When the last pass without errors started", registry=r)
        self.servers = Gauge("llmfleet_servers", "Intended servers by verdict (last pass)", ["verdict"], registry=r)
        self.actions = Counter("llmfleet_reconcile_actions",
                               "LiteLLM writes by kind and result (ok, failed; planned in a dry run)",
                               ["kind", "result"], registry=r)
        self.errors = Gauge("llmfleet_reconcile_last_pass_errors", "Observation errors in the last pass", registry=r)
        self.blocked = Gauge("llmfleet_reconcile_deletes_blocked", "1 when a safety valve held the last pass's "
                             "deletes", registry=r)
        self.held = Gauge("llmfleet_reconcile_held_actions", "Actions held back in the last pass", registry=r)
        self.rollout_halted = Gauge("llmfleet_rollout_halted", "1 while the staged rollout is halted (a released "
                                    "box failed and was rolled back)", registry=r)
        self.rollout_halts = Counter("llmfleet_rollout_halts", "Staged rollouts halted by a failed box",
                                     registry=r)
        self.rollout_boxes = Gauge("llmfleet_rollout_boxes", "Agent-managed boxes by rollout state (last pass)",
                                   ["state"], registry=r)
        self.drift = Gauge("llmfleet_litellm_unmanaged_deployments", "LiteLLM deployments not managed by llmfleet",
                           registry=r)

    def observe(self, record: PassRecord) -> None:
        self.passes.labels("ok" if record.ok else "error").inc()
        self.duration.set(record.duration_s)
        self.last.set(record.started_at)
        if record.ok:
            self.last_ok.set(record.started_at)
        for verdict in Verdict:
            self.servers.labels(str(verdict)).set(record.verdicts.get(str(verdict), 0))
        for action in record.actions:  # a dry run's are planned, not written
            result = "planned" if record.mode == "plan" else "ok" if action.ok else "failed"
            self.actions.labels(action.kind, result).inc()
        self.errors.set(len(record.errors))
        self.blocked.set(1 if record.blocked else 0)
        self.held.set(record.held)
        self.drift.set(record.drift)
        if record.rollout is not None:
            self.observe_rollout(record.rollout)

    def observe_rollout(self, rollout: RolloutPassRecord) -> None:
        self.rollout_halted.set(1 if rollout.state == RolloutState.HALTED else 0)
        if rollout.halt:
            self.rollout_halts.inc()
        counts = Counter_(rollout.boxes.values())
        for state in BoxState:
            self.rollout_boxes.labels(str(state)).set(counts.get(str(state), 0))

    def write_textfile(self, path: str) -> None:
        write_to_textfile(path, self.registry)
