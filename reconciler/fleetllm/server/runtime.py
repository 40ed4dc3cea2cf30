"""Start-up: everything the server needs, built from the config and checked before any port is bound.

`start_up(config)` opens (and migrates) the state store, opens or clones the fleet repository, loads
the last valid commit, builds the installer once and packs the gateway's compiled builds once
(nativebuilds.py). `fleetllm serve --check` runs exactly this.
`Runtime.start_background()` then refreshes the branch every `refresh_interval_s` (with jitter).

Several replicas may share one PostgreSQL state store: each tracks the branch on its own and serves
by commit, so they agree once each has refreshed; `replica` names this one in /health and in the
fetch log.
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

from flask import Flask, current_app

from fleetllm.adapters.git import TrackedRepo
from fleetllm.adapters.notify import Notifier, disabled
from fleetllm.adapters.oidc import OidcClient
from fleetllm.adapters.state import open_store
from fleetllm.adapters.state.control import pin_of
from fleetllm.adapters.state.notifications import SqlLedger
from fleetllm.adapters.state.store import StateStore
from fleetllm.core.control import NOTHING, ControlState
from fleetllm.core.fleet.model import ReconcileSettings
from fleetllm.core.fleet.render import Bearers
from fleetllm.errors import SourceError
from fleetllm.logs import get_logger, log_event
from fleetllm.server.boxrecords import BoxRecords
from fleetllm.server.metrics import BoxTimes, Metrics
from fleetllm.server.nativebuilds import GatewayBuilds, load_gateway_builds
from fleetllm.server.notifywatch import watch_passes
from fleetllm.server.revisions import RevisionTracker
from fleetllm.settings import ControlPlaneConfig, default_clone_dir, make_notifier
from fleetllm_installer.zipapp import build_zipapp_bytes

log = get_logger("runtime")
EXTENSION = "fleetllm"  # create_app keeps the Runtime at app.extensions[EXTENSION]
CONTROL_POLL_S = 2.0  # how often a replica re-reads the operator controls (a pin set through another one)


@dataclass(frozen=True)
class Installer:
    """The box program served at GET /vllm/installer, built once at start-up."""

    body: bytes
    sha256: str

    @property
    def etag(self) -> str:
        return f'"{self.sha256}"'

    @classmethod
    def build(cls) -> Installer:
        body = build_zipapp_bytes()
        return cls(body, hashlib.sha256(body).hexdigest())


@dataclass
class Runtime:
    config: ControlPlaneConfig
    store: StateStore
    repo: TrackedRepo
    tracker: RevisionTracker
    metrics: Metrics
    installer: Installer
    clock: Callable[[], float] = time.time
    replica: str = field(default_factory=socket.gethostname)
    started_at: float = field(default_factory=time.time)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    notifier: Notifier = field(default_factory=disabled)  # notifications.*: invalid commits, overdue passes
    control: ControlState = NOTHING  # the operator controls as last read from the store (refresh_control)
    oidc: OidcClient | None = None  # auth.oidc: the single sign-on provider's client (reads nothing until used)
    _control_thread: threading.Thread | None = None
    box_records: BoxRecords = field(default_factory=BoxRecords)  # what box answers record (boxrecords.py)
    # The gateway's compiled builds served at GET /vllm/gateway-native/<tag> (server.gateway_native)
    gateway_builds: GatewayBuilds = field(default_factory=lambda: GatewayBuilds(None))

    def start_background(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="fleetllm-refresh", daemon=True)
            self._thread.start()
        if self._control_thread is None:
            self._control_thread = threading.Thread(target=self._control_loop, name="fleetllm-control", daemon=True)
            self._control_thread.start()

    def refresh_control(self) -> ControlState:
        """Re-read the operator controls (suspend, pin, sync) from the store and serve the pin's revision,
        so that a pin set through any replica (or straight in the store) holds on this one within
        CONTROL_POLL_S. Returns what is in force."""
        state = self.store.control()
        self.control = state
        self.tracker.set_pin(pin_of(self.store) if state.pin is not None else None)
        self.metrics.control(state)
        return state

    def _control_loop(self) -> None:
        while not self._stop.wait(CONTROL_POLL_S):
            try:
                self.refresh_control()
            except Exception as exc:  # the loop must survive a store outage; the error is logged
                log_event(log, "control refresh error", logging.ERROR, error=f"{type(exc).__name__}: {exc}")

    def _loop(self) -> None:
        interval = self.config.repo.refresh_interval_s
        while not self._stop.wait(interval * random.uniform(0.9, 1.1)):  # noqa: S311 - jitter, not crypto
            try:
                self.tracker.refresh()
            except Exception as exc:  # the loop must survive anything; the error is logged
                log_event(log, "refresh loop error", logging.ERROR, error=f"{type(exc).__name__}: {exc}")
            try:
                self.watch_passes()
            except Exception as exc:  # the state store is down, say: the loop goes on
                log_event(log, "pass watch error", logging.ERROR, error=f"{type(exc).__name__}: {exc}")

    def watch_passes(self) -> None:
        """Notify an overdue reconcile pass (server/notifywatch.py)."""
        served = self.tracker.served
        settings = served.fleet.settings.reconcile if served is not None else ReconcileSettings()
        expected = self.config.reconcile.enabled  # the rollouts need passes, with or without LiteLLM
        watch_passes(self.notifier, self.store, expected=expected, interval_s=settings.interval_s,
                     since=self.started_at, now=self.clock())

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        if self._control_thread is not None:
            self._control_thread.join(timeout=10)
            self._control_thread = None
        with self.tracker.git_lock:
            self.repo.close()
        self.notifier.close(self.config.notifications.drain_timeout_s)  # before the store its ledger is in
        self.store.close()


def runtime_of(app: Flask) -> Runtime:
    return cast(Runtime, app.extensions[EXTENSION])


def box_times(store: StateStore, tracker: RevisionTracker) -> BoxTimes:
    """The served revision's boxes with when each last got its config and last reported, and the unknown
    boxes of the attention list (for /metrics)."""
    served = tracker.served
    if served is None:
        return BoxTimes(())
    unknown = [e.last_seen for e in store.attention() if e.box not in served.fleet.boxes]
    return BoxTimes(tuple(served.fleet.boxes), store.last_config_answered(),
                    {box: r.received_at for box, r in store.latest_reports().items()},
                    len(unknown), max(unknown, default=0.0))


def current_runtime() -> Runtime:
    """The Runtime of the app handling this request: how every view reaches the config, the store and
    the served revision (no view closes over it)."""
    return runtime_of(current_app)


def replica_name(port: int | None = None) -> str:
    """FLEETLLM_REPLICA when set (a pod name, say); else host name, and the port when given (two
    replicas on one machine)."""
    return os.environ.get("FLEETLLM_REPLICA") or socket.gethostname() + (f":{port}" if port else "")


def start_up(config: ControlPlaneConfig, *, clock: Callable[[], float] = time.time,
             replica: str | None = None) -> Runtime:
    """Build the runtime; raises StateError, SourceError or OSError with a clear message on failure."""
    metrics = Metrics()
    store = open_store(config.state.url, config.state.base, password=config.state.password,
                       retention=config.state.retention,
                       max_connections=config.threads + 2)
    repo = TrackedRepo(config.repo, default_clone_dir(config))  # opens nothing yet
    replica = replica or replica_name()
    notifier = make_notifier(config.notifications, SqlLedger(store.db), component="control-plane",
                             instance=replica, registry=metrics.registry)
    try:
        legacy = config.secrets.legacy_api_key.reveal() if config.secrets.legacy_api_key else None
        tracker = RevisionTracker(repo, Bearers(config.secrets.vllm_api_salt, legacy), metrics, clock, notifier)
        tracker.refresh(log_failure=False)  # a failure here is raised, and reported once by the caller
        if tracker.refresh_status.error is not None:
            raise SourceError(tracker.refresh_status.error)
        metrics.attention_entries.set(store.attention_size())
        metrics.weak_secrets.labels("vllm_api_salt").set(1 if config.secrets.vllm_api_salt.short else 0)
        metrics.watch_boxes(lambda: box_times(store, tracker))
        runtime = Runtime(config, store, repo, tracker, metrics, Installer.build(), clock,
                          replica, notifier=notifier, oidc=OidcClient(config.oidc, clock) if config.oidc else None,
                          gateway_builds=load_gateway_builds(config.gateway_native))
        runtime.refresh_control()  # a pin in force is served from the first request
    except BaseException:
        notifier.close()
        repo.close()
        store.close()
        raise
    return runtime
