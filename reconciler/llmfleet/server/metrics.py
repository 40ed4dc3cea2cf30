"""Prometheus metrics of one control plane, in a registry of its own (an app per test stays separate)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, disable_created_metrics, generate_latest

from llmfleet.core.control import ControlState

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Metrics:
    def __init__(self) -> None:
        disable_created_metrics()  # type: ignore[no-untyped-call]  # *_created series only add noise
        self.registry = CollectorRegistry()
        r = self.registry
        self.box_requests = Counter("llmfleet_box_requests", "Box requests by endpoint and HTTP status.",
                                    ["endpoint", "status"], registry=r)
        self.served_revision = Gauge("llmfleet_served_revision_info", "1 for the fleet revision being served.",
                                     ["revision"], registry=r)
        self.served_boxes = Gauge("llmfleet_served_boxes", "Boxes in the served revision.", registry=r)
        self.served_servers = Gauge("llmfleet_served_servers", "vLLM servers in the served revision.", registry=r)
        self.last_refresh = Gauge("llmfleet_git_last_successful_refresh_timestamp_seconds",
                                  "When the tracked branch was last read without error.", registry=r)
        self.refresh_errors = Counter("llmfleet_git_refresh_errors", "Failed fetches or reads of the tracked "
                                      "branch.", registry=r)
        self.validation_failures = Counter("llmfleet_commit_validation_failures", "Commits that failed "
                                           "validation (each counted once).", registry=r)
        self.last_attempted_valid = Gauge("llmfleet_last_attempted_revision_valid", "1 when the branch head is "
                                          "valid, 0 when an invalid head is being held back.", registry=r)
        self.attention_entries = Gauge("llmfleet_attention_entries", "Unknown boxes that presented the fleet "
                                       "key (the attention list).", registry=r)
        self.attention_evicted = Counter("llmfleet_attention_evicted", "Attention entries dropped at the cap.",
                                         registry=r)
        self.box_reports = Counter("llmfleet_box_reports", "Box reports received, by outcome.", ["outcome"],
                                   registry=r)
        self.weak_secrets = Gauge("llmfleet_weak_secret", "1 for a secret that works but is weak (vllm_api_salt: "
                                  "shorter than 16 characters), 0 otherwise.", ["secret"], registry=r)
        self.connections_open = Gauge("llmfleet_http_connections_open", "Open client connections.", registry=r)
        self.connections_refused = Counter("llmfleet_http_connections_refused", "Connections or bodies refused "
                                           "at a cap (per_peer, total, body_budget).", ["reason"], registry=r)
        self.login_refused = Counter("llmfleet_login_refused", "Login attempts refused (wrong token, or rate "
                                     "limited).", ["reason"], registry=r)
        self.suspended = Gauge("llmfleet_suspended", "1 while the fleet is suspended (llmfleet suspend): passes "
                               "observe and record, act on nothing.", registry=r)
        self.pinned = Gauge("llmfleet_pinned", "1 while the fleet is pinned to a revision (llmfleet pin).",
                            registry=r)
        self.sync_pending = Gauge("llmfleet_sync_requested", "1 while a sync request waits for a reconcile loop.",
                                  registry=r)
        self._revision: str | None = None

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

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
