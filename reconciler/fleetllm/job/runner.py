"""A reconcile pass as every caller runs it: `fleetllm plan`, `apply`, `reconcile` (`--once` and its
loop) and `fleetllm demo`. The pass itself is the engine's (fleetllm.job.engine.Reconciler.run_pass);
around it the runner keeps, in this order:

1. the single-flight lock (the state store's: a file lock, or PostgreSQL's advisory lock); a pass that
   finds it held is skipped, logged and counted, and hands no metrics over;
2. then, under the lock, the operator controls (fleetllm.core.control) read once: a pending sync
   request is taken (this pass is the one it asked for), a pin makes the pass work from the pinned
   revision, a suspension makes it observe and record but write nothing to LiteLLM;
3. the dry run (`reconcile.dry_run`, or the options' `dry_run`): recorded, LiteLLM not written, no box
   released (the rollout's step is computed and recorded, never saved);
4. the invalid head: the pass runs on the last valid commit and its record names the head;
5. after a pass that ran: its log line, the metrics (and their hand-over: a file, a Pushgateway push),
   the notifications, and the commit statuses of the rollout's transitions on the forge (`forge:`).

`RunnerOptions` is what a caller chooses, typed (the CLI builds it from its flags, the demo from its own
set-up); nothing here knows the command line. Errors are the project's tree (fleetllm.errors); the CLI
maps them to exit codes. Words for a person go to `say` (the CLI prints them on stderr).
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fleetllm.adapters.forge import CommitStatuses
from fleetllm.adapters.notify import Notifier
from fleetllm.adapters.state import is_memory_state, open_reconcile_state
from fleetllm.adapters.state.notifications import ledger_for
from fleetllm.adapters.state.reconcile import ReconcileState
from fleetllm.core.control import ControlState, Pin
from fleetllm.core.fleet.model import Fleet
from fleetllm.core.judge.adoption import AdoptSource
from fleetllm.errors import ConfigurationError, LockHeld, SourceError, StateError
from fleetllm.job.configfile import JobConfig
from fleetllm.job.engine import ApiFactory, PassOutcome, Reconciler
from fleetllm.job.forge import make_statuses, post_statuses
from fleetllm.job.loop import LOG, log_pass, run_forever
from fleetllm.job.metrics import PassMetrics
from fleetllm.job.notify import notify_crash, notify_pass
from fleetllm.job.pushmetrics import push_metrics, write_metrics_file
from fleetllm.job.saved import SavedPlan
from fleetllm.job.source import FleetSource, InvalidFleetError, InvalidHead, Say
from fleetllm.job.wiring import build_reconciler, rollout_driver
from fleetllm.logs import log_event
from fleetllm.settings import make_notifier

if TYPE_CHECKING:
    from fleetllm.job.capacity import CapacityLoop

__all__ = ["InvalidFleetError", "InvalidHead", "PassRunner", "RunnerOptions", "require_writer"]

LAST_SUCCESS_LOOKBACK = 50  # pass records read for the last success a failed batch pass hands over
FLEETS_KEPT = 64  # valid fleets by commit kept for the rollout (boxes' released revisions)


@dataclass(frozen=True)
class RunnerOptions:
    """What the caller of a pass chooses; every None falls back on the config."""

    command: str  # names the command in what is said: "fleetllm COMMAND: ..."
    repo: str | None = None  # a repository to read instead of the config's (--repo DIR)
    rev: str | None = None  # a revision to read instead of the tracked branch's newest valid (--rev, --against)
    state_url: str | None = None  # the state store instead of the config's state.url (--state)
    lock_file: str | None = None  # the single-flight lock file (default: beside the SQLite file)
    metrics_file: str | None = None  # instead of the config's reconcile.metrics_file
    adopt: AdoptSource | None = None  # adopt another control plane's deployments (--adopt)
    prune_adopted: bool = False  # with `adopt`: delete that owner's deployments the fleet does not have
    push: bool = False  # push each pass's metrics to the config's reconcile.pushgateway (`reconcile --once`)
    dry_run: bool | None = None  # None: the config's reconcile.dry_run; True: write nothing whatever it says
    litellm: ApiFactory | None = None  # LiteLLM's API for a pass's session; None: the config's (litellm.url)

    def __post_init__(self) -> None:
        if self.prune_adopted and self.adopt is None:
            raise ConfigurationError("--prune-adopted needs --adopt SOURCE")


def require_writer(config: JobConfig, command: str) -> None:
    """`apply` writes to LiteLLM, `reconcile` runs the rollouts (and writes LiteLLM when there is one):
    refuse, saying why, when this config cannot or must not. Without a litellm section `reconcile` runs:
    the boxes route (their gateway, or a balancer in front of them), and the rollouts restart them."""
    if not config.enabled:
        raise ConfigurationError(f"reconcile.enabled is false in {config.source}: the reconciler is switched off "
                                 f"for this fleet, so `fleetllm {command}` runs no pass and writes nothing. Set it to "
                                 "true to run passes; `fleetllm plan` (which writes nothing) still works")
    if config.litellm_url is None and command == "apply":
        raise ConfigurationError(f"`fleetllm {command}` writes to LiteLLM, and {config.source} has no litellm section "
                                 "(url, master_key): add one. `fleetllm plan` works without it and shows every "
                                 "server's verdict; `fleetllm reconcile` runs the rollouts without it (the boxes "
                                 "route)")


class PassRunner:
    """Runs passes for one process: the reconciler and its state store are built at the first pass and
    kept; `fleet` and `invalid_head` are what the last read of the fleet found."""

    def __init__(self, options: RunnerOptions, config: JobConfig, *, say: Say) -> None:
        self.options = options
        self.config = config
        self.say = say
        self.source = FleetSource(config, options.repo, options.rev)
        self.metrics = PassMetrics()
        self.reconciler: Reconciler | None = None
        self.notifier: Notifier | None = None  # notifications.*: sent beside the passes, never holding one up
        self.statuses: CommitStatuses | None = None  # forge.*: commit statuses, the same way
        self.fleet: Fleet | None = None
        self.invalid_head: InvalidHead | None = None
        self._seeded = False  # the last success read from the state store (once per process)
        self._fleets: dict[str, Fleet | None] = {}
        self.capacity: CapacityLoop | None = None  # fleet.yaml capacity: rentals and terminations with back-off

    # -- the fleet -----------------------------------------------------------------------------------
    def read(self, *, walk: bool = True) -> Fleet:
        """Read the fleet (kept as `fleet`): with `walk`, the tracked branch's newest valid commit and the
        head when it is not that commit (`invalid_head`); without, the revision as it is (`apply`).
        SourceError when it cannot be read, InvalidFleetError when nothing valid is there."""
        if walk:
            fleet, invalid = self.source.tracked(self.say, self.options.command)
        else:
            fleet, invalid = self.source.load(self.say), None
        self.fleet, self.invalid_head = fleet, invalid
        return fleet

    def reread(self) -> Fleet:
        """The tracked branch read again before a scheduled pass; when it cannot be read, the fleet read
        last is kept (and logged). The first read has nothing to keep: its error is raised."""
        if self.fleet is None:
            return self.read()
        try:
            return self.read()
        except (SourceError, InvalidFleetError) as exc:
            log_event(LOG, "fleet_invalid", logging.WARNING, error=str(exc), keeping=self.fleet.revision)
            return self.fleet

    def fleet_at(self, revision: str) -> Fleet | None:
        """The valid fleet at a commit (a box's released revision), read from git objects; None when it
        cannot be read or is not valid. Commits do not change: the outcome is kept."""
        if revision in self._fleets:
            return self._fleets[revision]
        fleet = self.source.fleet_at(revision)
        if len(self._fleets) >= FLEETS_KEPT:
            self._fleets.clear()
        self._fleets[revision] = fleet
        return fleet

    # -- the reconciler and its store ----------------------------------------------------------------
    def store(self) -> ReconcileState:
        try:
            return open_reconcile_state(self.options.state_url or self.config.state_url, self.config.state_password)
        except (ValueError, OSError, StateError) as exc:
            raise StateError(f"state store: {exc}") from None

    def build(self, fleet: Fleet) -> Reconciler:
        if self.reconciler is None:
            self.reconciler = build_reconciler(self.config, fleet.settings.reconcile, self.store())
            self.reconciler.rollout = rollout_driver(self.reconciler.store, self.fleet_at, self.reconciler.bearers)
            if self.options.litellm is not None:  # a LiteLLM of the caller's (the demo's table in memory)
                self.reconciler.api_factory = self.options.litellm
                self.reconciler.observer.boxes_route = False
        return self.reconciler

    def state_known(self) -> bool:
        """Whether this runner reads a real state store: an in-memory one (no state.url, --state memory:)
        cannot hold an operator's pin or suspension, so what the reconcile job would do is not known."""
        return not is_memory_state(self.options.state_url or self.config.state_url)

    @property
    def dry_run(self) -> bool:
        return self.options.dry_run if self.options.dry_run is not None else self.config.dry_run

    # -- the operator controls -----------------------------------------------------------------------
    def controls(self, fleet: Fleet) -> ControlState:
        """The operator controls in force (pin, suspension), read once from this runner's state store."""
        return self.build(fleet).store.control()

    def pinned(self, fleet: Fleet, controls: ControlState, *, follow: bool = True) -> Fleet:
        """The fleet a pass works from: the one resolution of the pin that the reconcile job
        (`locked_pass`), `apply` and `plan` share (follow_pin of the controls' pin). With `follow` false
        (`plan --against REV`), `fleet` is kept."""
        return self.follow_pin(fleet, controls.pin) if follow else fleet

    def follow_pin(self, fleet: Fleet, pin: Pin | None) -> Fleet:
        """The pinned revision while a pin is in force (fleetllm pin; looked up from the state store), else
        `fleet` (the newest valid commit, or the revision asked for)."""
        if pin is None or fleet.revision == pin.revision:
            return fleet
        log_event(LOG, "reconcile_pinned", revision=pin.revision, newest=fleet.revision, actor=pin.actor,
                  reason=pin.reason)
        return self.source.at(pin.revision).load(self.say)

    def take_sync(self) -> bool:
        """A sync request taken from the state store (one loop takes each): run a pass now."""
        if self.reconciler is None:
            return False
        request = self.reconciler.store.take_sync_request()
        if request is None:
            return False
        log_event(LOG, "reconcile_sync_requested", actor=request.actor, reason=request.reason,
                  requested_at=request.at)
        self.metrics.syncs.inc()
        return True

    # -- passes --------------------------------------------------------------------------------------
    async def run(self, fleet: Fleet, *, apply: bool, saved: SavedPlan | None = None,
                  record: bool | None = None, invalid_head: InvalidHead | None = None,
                  suspended: bool = False) -> PassOutcome:
        """The engine's pass on `fleet`, as it is: no lock, no controls (`plan`, and `apply`'s plan shown
        before it asks). RenderError, StalePlan: the pass did not run."""
        reconciler = self.build(fleet)
        knobs = fleet.settings.reconcile  # a new commit may change them
        reconciler.observer.probe_timeout_s = knobs.probe_timeout_s
        reconciler.observer.probe_concurrency = knobs.probe_concurrency
        return await reconciler.run_pass(fleet, apply=apply, saved=saved, record=record,
                                         adopt_from=self.options.adopt, prune_adopted=self.options.prune_adopted,
                                         invalid_head=(invalid_head.revision, invalid_head.errors)
                                         if invalid_head is not None else None, suspended=suspended)

    async def locked_pass(self, fleet: Fleet, saved: SavedPlan | None = None,
                          invalid_head: InvalidHead | None = None) -> PassOutcome | None:
        """One recorded pass under the lock, honouring the controls and the dry run; None when another
        pass holds the lock (skipped)."""
        store = self.build(fleet).store
        try:
            with store.pass_lock(self.options.lock_file):
                controls = store.control()
                store.take_sync_request()  # this pass is the one a pending sync asked for
                fleet = self.pinned(fleet, controls)
                if self.dry_run:
                    log_event(LOG, "reconcile_dry_run", reason=(
                        "reconcile.dry_run is true in the config" if self.options.dry_run is None else
                        f"fleetllm {self.options.command} runs dry")
                              + ": the pass is recorded; LiteLLM is not written and nothing is released to the boxes")
                if controls.suspended is not None:
                    log_event(LOG, "reconcile_suspended", reason="the fleet is suspended (fleetllm resume ends "
                                                               "it): the pass observes and records, LiteLLM is "
                                                               "not written", actor=controls.suspended.actor,
                              why=controls.suspended.reason, since=controls.suspended.at)
                self.metrics.suspended.set(1 if controls.suspended is not None else 0)
                self.metrics.pinned.set(1 if controls.pin is not None else 0)
                act = not self.dry_run and controls.suspended is None
                outcome = await self.run(fleet, apply=act, saved=saved, record=True, invalid_head=invalid_head,
                                         suspended=controls.suspended is not None)
        except LockHeld as exc:
            log_event(LOG, "reconcile_pass_skipped", reason=str(exc))
            self.metrics.skipped.inc()
            return None
        except StateError as exc:
            raise StateError(f"state store: {exc}") from None
        log_pass(outcome.record)
        if self.handing_over and not outcome.record.ok and not self._seeded:
            self._seeded = True
            try:  # a failed batch pass hands over the fleet's last success, not 0 (PassMetrics.seed_last_success)
                self.metrics.seed_last_success(store.recent_passes(LAST_SUCCESS_LOOKBACK))
            except StateError as exc:
                log_event(LOG, "last_success_unknown", logging.WARNING, error=str(exc))
        self.metrics.observe(outcome.record)
        self.metrics.observe_litellm(outcome.observation.deployments is not None)
        notify_pass(self.notifications(store), outcome.record)
        if (statuses := self.commit_statuses()) is not None:
            post_statuses(statuses, outcome.record)
        self.hand_over()
        return outcome

    async def scheduled_pass(self) -> PassOutcome | None:
        """One pass of the reconcile job, as its loop runs one every interval (and `fleetllm demo` between
        its own steps): the tracked branch read again (`reread`), then `locked_pass` on its newest valid
        commit. A pass that raises is notified as crashed (pass_failed), then re-raised."""
        fleet = self.reread()
        try:
            outcome = await self.locked_pass(fleet, invalid_head=self.invalid_head)
        except Exception as exc:
            self.crashed(exc)
            raise
        if outcome is not None and outcome.record.written and fleet.settings.capacity is not None:
            await self.capacity_step(fleet, outcome)
        return outcome

    async def capacity_step(self, fleet: Fleet, outcome: PassOutcome) -> None:
        """Rent and terminate what fleet.yaml's capacity says, after a pass that wrote (fleetllm.job.capacity);
        an error here is logged and never stops the loop."""
        from fleetllm.job.capacity import CapacityLoop

        if self.capacity is None:
            store = self.build(fleet).store
            self.capacity = CapacityLoop(self.config.providers, self.metrics, self.notifications(store), store)
        try:
            await self.capacity.step(fleet, outcome, time.time())
        except Exception as exc:
            log_event(LOG, "capacity_crashed", logging.ERROR, error=f"{type(exc).__name__}: {exc}")

    async def loop(self, interval_s: float | None = None) -> int:
        """`scheduled_pass` until SIGTERM/SIGINT, every `interval_s` (default: the fleet's
        reconcile.interval_s) with jitter, at once on a sync request (fleetllm.job.loop.run_forever)."""
        def interval() -> float:
            assert self.fleet is not None
            return float(interval_s or self.fleet.settings.reconcile.interval_s)

        return await run_forever(self.scheduled_pass, interval, self.metrics, wake=self.take_sync)

    # -- after a pass --------------------------------------------------------------------------------
    @property
    def metrics_file(self) -> str | None:
        path = self.options.metrics_file or self.config.metrics_file
        return str(path) if path else None

    @property
    def handing_over(self) -> bool:
        """Whether this process's metrics leave it after each pass (a file, a push) rather than only being
        scraped while it runs."""
        return bool(self.metrics_file or (self.options.push and self.config.pushgateway))

    def hand_over(self) -> None:
        """After a pass that ran (ok, failed, suspended, dry run; never a skipped one, which would replace
        the pass that held the lock with empty gauges): the metrics file (the options', else
        reconcile.metrics_file), and with `push` the Pushgateway (reconcile.pushgateway). A failure is
        logged and said; it never changes the pass's outcome."""
        command = self.options.command
        path = self.metrics_file
        if path and (error := write_metrics_file(self.metrics.registry, path)) is not None:
            self.say(f"fleetllm {command}: warning: the metrics file {path} was not written ({error}); the pass's "
                     "outcome stands")
        target = self.config.pushgateway
        if self.options.push and target is not None and (
                error := push_metrics(self.metrics.registry, target)) is not None:
            self.say(f"fleetllm {command}: warning: the pass metrics were not pushed to the Pushgateway "
                     f"{target.where} ({error}); the pass's outcome stands")

    def notifications(self, store: ReconcileState) -> Notifier:
        if self.notifier is None:
            self.notifier = make_notifier(self.config.settings.notifications, ledger_for(store),
                                          component="reconciler", instance=socket.gethostname(),
                                          registry=self.metrics.registry)
        return self.notifier

    def commit_statuses(self) -> CommitStatuses | None:
        """The forge's commit statuses (forge.* in the config); None when no forge is configured."""
        forge = self.config.settings.forge
        if forge is None or forge.token is None:
            return None
        if self.statuses is None:
            self.statuses = make_statuses(forge, self.metrics.registry)
        return self.statuses

    def crashed(self, exc: BaseException) -> None:
        """A pass raised: notified as pass_failed (crashed), resolved by the next pass that completes."""
        if self.reconciler is not None:
            notify_crash(self.notifications(self.reconciler.store), exc)

    def close(self) -> None:
        """Wait (notifications.drain_timeout_s, forge.drain_timeout_s at most) for the notifications and
        commit statuses still queued, then stop; close the state store."""
        if self.notifier is not None:
            self.notifier.close(self.config.settings.notifications.drain_timeout_s)
        if self.statuses is not None:
            self.statuses.close(self.statuses.config.drain_timeout_s)
        close: Callable[[], object] | None = getattr(self.reconciler.store, "close", None) if self.reconciler else None
        if close is not None:  # SQLite, PostgreSQL (the in-memory store has nothing to close)
            close()
