"""Prometheus metrics of reconcile passes (own registry: several reconcilers may share a process in tests),
and the HTTP server `fleetllm reconcile --metrics-listen` exposes them with (`serve_metrics`)."""

from __future__ import annotations

import json
import socket
import threading
from collections import Counter as Counter_
from collections.abc import Callable, Iterable, Sequence
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, make_wsgi_app

from fleetllm.adapters.state.passes import PassMode, PassRecord, RolloutPassRecord
from fleetllm.core.judge.verdict import SERVING, Verdict
from fleetllm.core.rollout.model import BoxState, RolloutState
from fleetllm.core.secret import LIVE_PATH, METRICS_CHALLENGE, Secret, metrics_refusal

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class PassMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.passes = Counter("fleetllm_reconcile_passes", "Reconcile passes by outcome", ["outcome"], registry=r)
        self.skipped = Counter("fleetllm_reconcile_skipped", "Passes skipped: another pass held the lock",
                               registry=r)
        self.duration = Gauge("fleetllm_reconcile_last_pass_duration_seconds", "Duration of the last pass",
                              registry=r)
        self.last = Gauge("fleetllm_reconcile_last_pass_timestamp_seconds", "When the last pass started",
                          registry=r)
        self.last_ok = Gauge("fleetllm_reconcile_last_success_timestamp_seconds",
                             "When the last pass without errors started", registry=r)
        self.servers = Gauge("fleetllm_servers", "Intended servers by verdict (last pass)", ["verdict"], registry=r)
        self.actions = Counter("fleetllm_reconcile_actions",
                               "LiteLLM writes by kind and result (ok, failed; planned in a dry run, suspended while "
                               "the fleet is suspended: not written)",
                               ["kind", "result"], registry=r)
        self.errors = Gauge("fleetllm_reconcile_last_pass_errors", "Observation errors in the last pass", registry=r)
        self.blocked = Gauge("fleetllm_reconcile_deletes_blocked", "1 when a safety valve held the last pass's "
                             "deletes", registry=r)
        self.held = Gauge("fleetllm_reconcile_held_actions", "Actions held back in the last pass", registry=r)
        self.suspended = Gauge("fleetllm_reconcile_suspended", "1 when the last pass ran suspended (fleetllm "
                               "suspend): it observed and recorded, and wrote nothing", registry=r)
        self.pinned = Gauge("fleetllm_reconcile_pinned", "1 when the last pass worked from a pinned revision "
                            "(fleetllm pin)", registry=r)
        self.syncs = Counter("fleetllm_reconcile_sync_requests", "Sync requests taken (a pass run at once)",
                             registry=r)
        self.rollout_boxes = Gauge("fleetllm_rollout_boxes", "Agent-managed boxes by rollout state (last pass)",
                                   ["state"], registry=r)
        self.drift = Gauge("fleetllm_litellm_unmanaged_deployments", "LiteLLM deployments not managed by fleetllm",
                           registry=r)
        self.model_intended = Gauge("fleetllm_model_intended_servers", "Servers the served revision places for "
                                    "the model (last pass)", ["model"], registry=r)
        self.model_serving = Gauge("fleetllm_model_serving_servers", "The model's servers judged serving "
                                   "(Healthy or Stale) in the last pass", ["model"], registry=r)
        self.box_stale = Gauge("fleetllm_box_stale_servers", "The box's servers judged Stale in the last pass "
                               "(serving an older boot config: the box needs a restart); boxes with none have no "
                               "series", ["box"], registry=r)
        self.fleet_cost = Gauge("fleetllm_fleet_cost_per_hour", "What the fleet's rented boxes cost, USD per hour, "
                                "from the providers' listings (last pass; unpriced boxes count nothing: see "
                                "fleetllm_unpriced_boxes)", registry=r)
        self.box_cost = Gauge("fleetllm_box_cost_per_hour", "What the box costs, USD per hour, from its provider's "
                              "listing (last pass; boxes without a price have no series)", ["box"], registry=r)
        self.model_cost = Gauge("fleetllm_model_cost_per_hour", "The model's share of its boxes' cost, USD per hour "
                                "(a box's price divided among its servers by vram_gb; last pass)", ["model"],
                                registry=r)
        self.unpriced = Gauge("fleetllm_unpriced_boxes", "Rented boxes (Vast, RunPod) whose price the last pass "
                              "could not read (listing failed, no key): the cost gauges leave them out", registry=r)
        self.capacity_actions = Counter("fleetllm_capacity_actions", "Rentals and terminations the reconcile loop "
                                        "executed (fleet.yaml capacity:), by kind and result", ["kind", "result"],
                                        registry=r)
        self.capacity_failing = Gauge("fleetllm_capacity_failing", "Rentals and terminations backing off after a "
                                      "failure (tried again after 1, 2, 4 ... 60 min)", registry=r)
        self.capacity_held = Gauge("fleetllm_capacity_held", "Rentals and terminations the last capacity plan held "
                                   "(a valve, no offer under the price, a box not retired, a back-off)", registry=r)
        self.litellm_up = Gauge("fleetllm_litellm_up", "1 when the last pass listed LiteLLM's deployments, 0 when "
                                "the listing failed (LiteLLM unreachable or refusing the master key); NaN before the "
                                "first pass", registry=r)
        self.litellm_up.set(float("nan"))  # not known yet: no alert compares true on it
        # Rollouts (set by the rollout engine).
        self.rollout_halted = Gauge("fleetllm_rollout_halted", "1 while the current rollout is halted", registry=r)
        self.rollout_halts = Counter("fleetllm_rollout_halts", "rollouts halted", registry=r)
        # the control plane's own gauge of the same name (fleetllm.server.metrics), for the reconcile job
        self.head_valid = Gauge("fleetllm_last_attempted_revision_valid", "1 when the tracked branch head was valid "
                                "at the last pass; 0: the pass ran on the last valid commit", registry=r)
        self.invalid_head = Counter("fleetllm_reconcile_invalid_head_passes", "Passes that ran on the last valid "
                                    "commit because the branch head is not valid", registry=r)

    def observe(self, record: PassRecord) -> None:
        self.passes.labels("ok" if record.ok else "error").inc()
        self.duration.set(record.duration_s)
        self.last.set(record.started_at)
        if record.ok:
            self.last_ok.set(record.started_at)
        for verdict in Verdict:
            self.servers.labels(str(verdict)).set(record.verdicts.get(str(verdict), 0))
        for action in record.actions:  # a dry run's are planned, a suspended pass's held: neither is written
            result = ("ok" if action.ok else "failed") if record.written else \
                "suspended" if record.mode == PassMode.SUSPENDED else "planned"
            self.actions.labels(action.kind, result).inc()
        self.errors.set(len(record.errors))
        self.blocked.set(1 if record.blocked else 0)
        self.held.set(record.held)
        self.drift.set(record.drift)
        self.model_intended.clear()  # a model gone from the revision loses its series
        self.model_serving.clear()
        self.box_stale.clear()
        for server in record.servers:
            self.model_intended.labels(server.model).inc()
            self.model_serving.labels(server.model).inc(1 if Verdict(server.verdict) in SERVING else 0)
            if server.verdict == Verdict.STALE:
                self.box_stale.labels(server.box).inc()
        self.observe_cost(record)
        self.head_valid.set(1 if record.head_valid else 0)
        if not record.head_valid:
            self.invalid_head.inc()
        if record.rollout is not None:
            self.observe_rollout(record.rollout)

    def observe_cost(self, record: PassRecord) -> None:
        self.box_cost.clear()  # a box gone (or unpriced now) loses its series
        self.model_cost.clear()
        cost = record.cost
        self.fleet_cost.set(cost.total if cost is not None else 0)
        self.unpriced.set(len(cost.unpriced) if cost is not None else 0)
        for box, usd in (cost.boxes if cost is not None else {}).items():
            self.box_cost.labels(box).set(usd)
        for model, usd in (cost.models if cost is not None else {}).items():
            self.model_cost.labels(model).set(usd)

    def observe_rollout(self, rollout: RolloutPassRecord) -> None:
        self.rollout_halted.set(1 if rollout.state == RolloutState.HALTED else 0)
        if rollout.halt:
            self.rollout_halts.inc()
        counts = Counter_(rollout.boxes.values())
        for state in BoxState:
            self.rollout_boxes.labels(str(state)).set(counts.get(str(state), 0))

    def seed_last_success(self, records: Sequence[PassRecord]) -> None:
        """The last success before this process: from the state store's pass records (newest first). A batch
        process (`reconcile --once`) runs one pass, and its metrics replace the last ones (a Pushgateway
        group, a textfile): without this a failed pass would hand over a last success of 0, as if none had
        ever run. None among them: left as it is (0 until a pass succeeds)."""
        ok = next((r for r in records if r.ok), None)
        if ok is not None:
            self.last_ok.set(ok.started_at)

    def observe_litellm(self, listed: bool) -> None:
        """Whether the pass could list LiteLLM's deployments (its reachability, as the reconciler sees it)."""
        self.litellm_up.set(1 if listed else 0)


def metrics_app(registry: CollectorRegistry, token: Secret | None) -> WsgiApp:
    """The reconciler's metrics over HTTP: GET /health/live is "ok" for anyone (a liveness probe); every other
    path is the exposition, behind metrics_token when it is set (fleetllm.core.secret.metrics_refusal, as
    the control plane's /metrics): 401 without it, 403 with another one, a JSON error and no metric."""
    exposition = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") == LIVE_PATH:
            start_response("200 OK", [("Content-Type", "text/plain; charset=utf-8")])
            return [b"ok\n"]
        refusal = metrics_refusal(token, environ.get("HTTP_AUTHORIZATION"))
        if refusal is None:
            return exposition(environ, start_response)  # type: ignore[no-any-return]
        status, message = refusal
        headers = [("Content-Type", "application/json"), ("Cache-Control", "no-store")]
        if status == 401:
            headers.append(("WWW-Authenticate", METRICS_CHALLENGE))
        start_response(f"{status} {'Unauthorized' if status == 401 else 'Forbidden'}", headers)
        return [json.dumps({"error": message}).encode()]

    return app


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """The log is JSON lines (fleetllm.logs): no access line per scrape on stderr."""


def serve_metrics(listen: str, registry: CollectorRegistry, token: Secret | None) -> WSGIServer:
    """Serve `metrics_app` at HOST:PORT (`[v6]:PORT`; no host: 127.0.0.1) on a daemon thread; returns the
    server (its `shutdown()` stops it)."""
    host, _, port = listen.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"

    class Server(_Server):
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

    server = make_server(host, int(port), metrics_app(registry, token), Server, _Quiet)
    threading.Thread(target=server.serve_forever, name="fleetllm-metrics", daemon=True).start()
    return server
