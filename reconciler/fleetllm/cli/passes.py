"""What `fleetllm plan`, `apply` and `reconcile` share: arguments, loading the config and the last
valid fleet, running one pass, printing it, and the exit code."""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from fleetllm.adapters.git import GitFleetRepo, TrackedRepo, is_bare_repository, read_fleet
from fleetllm.adapters.notify import Notifier
from fleetllm.adapters.state import is_memory_state, open_reconcile_state
from fleetllm.adapters.state.notifications import ledger_for
from fleetllm.adapters.state.reconcile import ReconcileState
from fleetllm.cli.common import CommandError, add_repo_arguments, eprint, load_validation
from fleetllm.core.control import ControlState, Pin
from fleetllm.core.fleet.diagnostics import format_text
from fleetllm.core.fleet.files import WORKTREE_REVISION, Snapshot
from fleetllm.core.fleet.history import newest_valid
from fleetllm.core.fleet.model import Fleet
from fleetllm.core.fleet.render import RenderError
from fleetllm.core.fleet.validate import Validation, validate_snapshot
from fleetllm.core.judge.adoption import AdoptSource
from fleetllm.core.judge.plantext import render_json, render_text
from fleetllm.errors import ConfigurationError, SourceError, StateError
from fleetllm.job.configfile import ReconcileConfig, config_from_env, load_config
from fleetllm.job.engine import PassOutcome, Reconciler
from fleetllm.job.loop import LOG, LockHeld, log_pass
from fleetllm.job.metrics import PassMetrics
from fleetllm.job.notify import make_notifier, notify_crash, notify_pass
from fleetllm.job.pushmetrics import push_metrics, write_metrics_file
from fleetllm.job.saved import SavedPlan, StalePlan
from fleetllm.job.wiring import build_reconciler, rollout_driver
from fleetllm.logs import log_event

EXIT_OK, EXIT_ERROR, EXIT_CHANGES = 0, 1, 2
EXIT_INVALID_HEAD = 3  # `reconcile --once`: the pass ran without errors on the last valid commit; the head is invalid
LAST_SUCCESS_LOOKBACK = 50  # pass records read for the last success a failed batch pass hands over


def add_pass_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE",
                        help="the control-plane config file (LiteLLM, providers, salt, state); without it: "
                             "LITELLM_URL, LITELLM_MASTER_KEY, FLEETLLM_VLLM_API_SALT, VAST_API_KEY, RUNPOD_API_KEY "
                             "from the environment")
    add_repo_arguments(parser)
    parser.set_defaults(repo=None)
    parser.add_argument("--state", metavar="URL", help="state store (default: state.url of the config), "
                        "sqlite:///PATH, postgresql://user@host:port/dbname (password: state.password or "
                        "PGPASSFILE) or memory:")
    parser.add_argument("--lock-file", metavar="FILE", help="single-flight lock file (default: beside the SQLite "
                        "file); a PostgreSQL state store always uses its advisory lock instead")
    parser.add_argument("--metrics-file", metavar="FILE",
                        help="write the pass metrics there in the Prometheus text format after each pass that "
                             "ran, atomically, for node_exporter's textfile collector (default: "
                             "reconcile.metrics_file of the config)")


def add_adopt_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--adopt", choices=[s.value for s in AdoptSource], metavar="SOURCE",
                        help="adopt another control plane's LiteLLM deployments (llmao: self_hosted, no fleetllm "
                             "marker): a serving server gets fleetllm's deployment first, then the old one is "
                             "deleted; commercial entries are never touched")
    parser.add_argument("--prune-adopted", action="store_true",
                        help="with --adopt: also delete that owner's deployments for servers the repository does "
                             "not have (under the delete budget); without it they are reported and left")


def load_config_arg(args: argparse.Namespace) -> ReconcileConfig:
    try:
        config = load_config(args.config) if args.config else config_from_env(os.environ)
    except ConfigurationError as exc:
        raise CommandError(str(exc), EXIT_ERROR) from None
    if (warning := config.salt.warning()) is not None:
        eprint(f"fleetllm {args.command}: warning: {warning}")
    return config


def require_writer(config: ReconcileConfig, command: str) -> None:
    """`apply` and `reconcile` write to LiteLLM: refuse, saying why, when this config cannot or must not."""
    if not config.enabled:
        raise CommandError(f"reconcile.enabled is false in {config.source}: the reconciler is switched off for "
                           f"this fleet, so `fleetllm {command}` runs no pass and writes nothing. Set it to true to "
                           "run passes; `fleetllm plan` (which writes nothing) still works", EXIT_ERROR)
    if config.litellm_url is None:
        raise CommandError(f"`fleetllm {command}` writes to LiteLLM, and {config.source} has no litellm section "
                           "(url, master_key): add one. `fleetllm plan` works without it and shows every server's "
                           "verdict", EXIT_ERROR)


def repo_and_rev(args: argparse.Namespace, config: ReconcileConfig) -> tuple[str, str | None]:
    """--repo DIR [--rev REV] as given; else the config's repository at its tracked branch."""
    if args.repo:
        return args.repo, args.rev
    return config.repo_path or ".", args.rev or config.branch


def fetch_validation(args: argparse.Namespace, config: ReconcileConfig) -> Validation:
    """The fleet at the tracked branch (or --rev) of a remote repository (repo.url), fetched first into
    the reconciler's own bare clone, the way the control plane keeps its own."""
    assert config.remote_repo is not None
    assert config.clone_dir is not None
    tracked = TrackedRepo(config.remote_repo, config.clone_dir)
    try:
        tracked.update()
        return validate_snapshot(tracked.snapshot(args.rev or tracked.head()))
    except SourceError as exc:
        raise CommandError(f"{tracked.where}: {exc}", EXIT_ERROR) from None
    finally:
        tracked.close()


def load_fleet(args: argparse.Namespace, config: ReconcileConfig) -> Fleet:
    if config.remote_repo is not None and not args.repo:
        validation = fetch_validation(args, config)
    else:
        validation = load_validation(*repo_and_rev(args, config))
    if validation.diagnostics:  # errors, or warnings such as a deprecated public port
        eprint(format_text(validation.diagnostics))
    if validation.fleet is None:
        raise CommandError(f"the fleet at {validation.revision} is not valid: nothing is planned or applied; "
                           "fix it (fleetllm validate) or revert the commit", EXIT_ERROR)
    return validation.fleet


@dataclass(frozen=True)
class InvalidHead:
    """The tracked branch's head is not valid: passes run on `serving`, the newest valid commit behind it."""

    revision: str
    errors: tuple[str, ...]
    serving: str


def load_tracked(args: argparse.Namespace, config: ReconcileConfig) -> tuple[Fleet, InvalidHead | None]:
    """The fleet at the tracked branch's newest valid commit, and the head when it is not that commit.

    The walk back is the control plane's (fleetllm.core.fleet.history.newest_valid): an invalid head never
    stops reconciling, the passes go on with the last valid commit until a fix or a revert is pushed.
    An explicit --rev, or a working tree (--repo DIR without --rev), is read as it is: nothing to walk."""
    remote = config.remote_repo is not None and not args.repo
    if args.rev is not None or not (remote or repo_and_rev(args, config)[1] or is_bare_repository(args.repo or "")):
        return load_fleet(args, config), None
    tracked: TrackedRepo | None = None
    repo, rev = repo_and_rev(args, config)
    snapshot: Callable[[str], Snapshot]
    first_parent: Callable[[str], str | None]
    validations: dict[str, Validation] = {}
    where = repo
    try:
        if remote:
            assert config.remote_repo is not None
            assert config.clone_dir is not None
            tracked = TrackedRepo(config.remote_repo, config.clone_dir)
            where = tracked.where
            tracked.update()
            head = tracked.head()
            snapshot, first_parent = tracked.snapshot, tracked.first_parent
        else:
            local = GitFleetRepo(repo)
            head = local.resolve(rev or "HEAD")
            snapshot, first_parent = local.snapshot, local.first_parent

        def valid_at(revision: str) -> Fleet | None:
            validations[revision] = validate_snapshot(snapshot(revision))
            return validations[revision].fleet

        walk = newest_valid(head, valid_at, first_parent)
    except SourceError as exc:
        raise CommandError(f"{where}: {exc}", EXIT_ERROR) from None
    finally:
        if tracked is not None:
            tracked.close()
    validation = validations.get(head)
    if validation is not None and validation.diagnostics:  # errors, or warnings such as a deprecated public port
        eprint(format_text(validation.diagnostics))
    if walk.valid is None:
        raise CommandError(f"the fleet at {head} is not valid and no valid commit was found behind it: nothing is "
                           "planned or applied; fix it (fleetllm validate) or revert the commit", EXIT_ERROR)
    if walk.valid.revision == head or validation is None:
        return walk.valid, None
    errors = tuple(d.text() for d in validation.errors[:50])
    invalid = InvalidHead(head, errors, walk.valid.revision)
    eprint(f"fleetllm {args.command}: the branch head {head[:12]} is not valid ({len(errors)} error(s), above); "
           f"this pass runs on the last valid commit {invalid.serving[:12]}: push a fix or a revert")
    log_event(LOG, "fleet_invalid", logging.WARNING, head=head, keeping=invalid.serving, errors=list(errors))
    return walk.valid, invalid


@dataclass
class PassRunner:
    args: argparse.Namespace
    config: ReconcileConfig
    metrics: PassMetrics = field(default_factory=PassMetrics)
    reconciler: Reconciler | None = None
    notifier: Notifier | None = None  # notifications.*: sent beside the passes, never holding one up
    push: bool = False  # `reconcile --once`: push each pass's metrics to reconcile.pushgateway (hand_over)
    _seeded: bool = False  # the last success read from the state store (once per process)
    _fleets: dict[str, Fleet | None] = field(default_factory=dict)

    def store(self) -> ReconcileState:
        try:
            return open_reconcile_state(self.args.state or self.config.state_url, self.config.state_password)
        except (ValueError, OSError, StateError) as exc:
            raise CommandError(f"state store: {exc}", EXIT_ERROR) from None

    def build(self, fleet: Fleet) -> Reconciler:
        if self.reconciler is None:
            self.reconciler = build_reconciler(self.config, fleet.settings.reconcile, self.store())
            self.reconciler.rollout = rollout_driver(self.reconciler.store, self.fleet_at, self.reconciler.bearers)
        return self.reconciler

    def fleet_at(self, revision: str) -> Fleet | None:
        """The valid fleet at a commit (a box's released revision), read from git objects; None when it
        cannot be read or is not valid. Commits do not change: the outcome is kept."""
        if revision in self._fleets:
            return self._fleets[revision]
        fleet: Fleet | None = None
        try:
            if self.config.remote_repo is not None and not self.args.repo:
                assert self.config.clone_dir is not None
                tracked = TrackedRepo(self.config.remote_repo, self.config.clone_dir)
                try:
                    fleet = validate_snapshot(tracked.snapshot(revision)).fleet
                finally:
                    tracked.close()
            else:
                fleet = validate_snapshot(read_fleet(repo_and_rev(self.args, self.config)[0], revision)).fleet
        except SourceError:
            fleet = None
        if len(self._fleets) >= 64:
            self._fleets.clear()
        self._fleets[revision] = fleet
        return fleet

    async def run(self, fleet: Fleet, *, apply: bool, saved: SavedPlan | None = None,
                  record: bool | None = None, invalid_head: InvalidHead | None = None,
                  suspended: bool = False) -> PassOutcome:
        reconciler = self.build(fleet)
        knobs = fleet.settings.reconcile  # a new commit may change them
        reconciler.observer.probe_timeout_s = knobs.probe_timeout_s
        reconciler.observer.probe_concurrency = knobs.probe_concurrency
        try:
            adopt_from = getattr(self.args, "adopt", None)
            if getattr(self.args, "prune_adopted", False) and not adopt_from:
                raise CommandError("--prune-adopted needs --adopt SOURCE", EXIT_ERROR)
            return await reconciler.run_pass(fleet, apply=apply, saved=saved, record=record,
                                             adopt_from=AdoptSource(adopt_from) if adopt_from else None,
                                             prune_adopted=bool(getattr(self.args, "prune_adopted", False)),
                                             invalid_head=(invalid_head.revision, invalid_head.errors)
                                             if invalid_head is not None else None, suspended=suspended)
        except (RenderError, StalePlan) as exc:
            raise CommandError(str(exc), EXIT_ERROR) from None

    def controls(self, fleet: Fleet) -> ControlState:
        """The operator controls in force (pin, suspension), read once from this runner's state store."""
        return self.build(fleet).store.control()

    def pinned(self, fleet: Fleet, controls: ControlState, *, follow: bool = True) -> Fleet:
        """The fleet a pass works from: the one resolution of the pin that the reconcile job
        (`locked_apply`), `apply` and `plan` share (follow_pin of the controls' pin). With `follow` false
        (`plan --against REV`), `fleet` is kept."""
        return self.follow_pin(fleet, controls.pin) if follow else fleet

    def state_known(self) -> bool:
        """Whether this runner reads a real state store: an in-memory one (no state.url, --state memory:)
        cannot hold an operator's pin or suspension, so what the reconcile job would do is not known."""
        return not is_memory_state(self.args.state or self.config.state_url)

    def follow_pin(self, fleet: Fleet, pin: Pin | None) -> Fleet:
        """The fleet a pass works from: the pinned revision while a pin is in force (fleetllm pin; looked up
        from the state store), else `fleet` (the newest valid commit, or --rev)."""
        if pin is None or fleet.revision == pin.revision:
            return fleet
        log_event(LOG, "reconcile_pinned", revision=pin.revision, newest=fleet.revision, actor=pin.actor,
                  reason=pin.reason)
        pinned = argparse.Namespace(**{**vars(self.args), "rev": pin.revision})
        return load_fleet(pinned, self.config)

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

    async def locked_apply(self, fleet: Fleet, saved: SavedPlan | None = None,
                           invalid_head: InvalidHead | None = None) -> PassOutcome | None:
        store = self.build(fleet).store
        try:
            with store.pass_lock(self.args.lock_file):
                controls = store.control()
                store.take_sync_request()  # this pass is the one a pending sync asked for
                fleet = self.pinned(fleet, controls)
                if self.config.dry_run:
                    log_event(LOG, "reconcile_dry_run", reason="reconcile.dry_run is true in the config: "
                                                          "the pass is recorded, LiteLLM is not written")
                if controls.suspended is not None:
                    log_event(LOG, "reconcile_suspended", reason="the fleet is suspended (fleetllm resume ends "
                                                               "it): the pass observes and records, LiteLLM is "
                                                               "not written", actor=controls.suspended.actor,
                              why=controls.suspended.reason, since=controls.suspended.at)
                self.metrics.suspended.set(1 if controls.suspended is not None else 0)
                self.metrics.pinned.set(1 if controls.pin is not None else 0)
                act = not self.config.dry_run and controls.suspended is None
                outcome = await self.run(fleet, apply=act, saved=saved, record=True, invalid_head=invalid_head,
                                         suspended=controls.suspended is not None)
        except LockHeld as exc:
            log_event(LOG, "reconcile_pass_skipped", reason=str(exc))
            self.metrics.skipped.inc()
            return None
        except StateError as exc:
            raise CommandError(f"state store: {exc}", EXIT_ERROR) from None
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
        self.hand_over()
        return outcome

    @property
    def handing_over(self) -> bool:
        """Whether this process's metrics leave it after each pass (a file, a push) rather than only being
        scraped while it runs."""
        return bool(self.args.metrics_file or self.config.metrics_file or (self.push and self.config.pushgateway))

    def hand_over(self) -> None:
        """After a pass that ran (ok, failed, suspended, dry run; never a skipped one, which would replace
        the pass that held the lock with empty gauges): the metrics file (--metrics-file, else
        reconcile.metrics_file), and with `push` (`reconcile --once`) the Pushgateway (reconcile.pushgateway).
        A failure is logged and said on stderr; it never changes the pass's outcome or exit status."""
        path = self.args.metrics_file or self.config.metrics_file
        if path and (error := write_metrics_file(self.metrics.registry, path)) is not None:
            eprint(f"fleetllm {self.args.command}: warning: the metrics file {path} was not written ({error}); "
                   "the pass's outcome stands")
        target = self.config.pushgateway
        if self.push and target is not None and (error := push_metrics(self.metrics.registry, target)) is not None:
            eprint(f"fleetllm {self.args.command}: warning: the pass metrics were not pushed to the Pushgateway "
                   f"{target.where} ({error}); the pass's outcome stands")


    def notifications(self, store: ReconcileState) -> Notifier:
        if self.notifier is None:
            self.notifier = make_notifier(self.config.settings.notifications, ledger_for(store),
                                          component="reconciler", instance=socket.gethostname(),
                                          registry=self.metrics.registry)
        return self.notifier

    def crashed(self, exc: BaseException) -> None:
        """A pass raised: notified as pass_failed (crashed), resolved by the next pass that completes."""
        if self.reconciler is not None:
            notify_crash(self.notifications(self.reconciler.store), exc)

    def close(self) -> None:
        """Wait (notifications.drain_timeout_s at most) for the notifications still queued, then stop."""
        if self.notifier is not None:
            self.notifier.close(self.config.settings.notifications.drain_timeout_s)


def _since(at: float, actor: str, reason: str) -> str:
    when = datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return f"since {when} by {actor}" + (f": {reason}" if reason else " (no reason given)")


def control_note(runner: PassRunner, newest: Fleet, controls: ControlState, fleet: Fleet) -> str | None:
    """What `plan` and `apply` say about the operator controls before their plan: that the fleet is pinned
    (revision, who, when, why) and what the plan shows, that it is suspended (nothing of the plan is
    written); or, without a state store, that they cannot know."""
    if not runner.state_known():
        return ("Pin: unknown. No state store is configured (state.url in the config, or --state), so this "
                "plan cannot see an operator's pin (fleetllm pin) or suspension: the reconcile job reads them "
                "from its state store and may work from another revision than this plan.")
    lines = []
    pin = controls.pin
    if pin is not None:
        head = f"The fleet is PINNED to {pin.revision} {_since(pin.at, pin.actor, pin.reason)}."
        if fleet.revision == pin.revision:
            unpinned = "the working tree" if newest.revision == WORKTREE_REVISION else newest.revision[:12]
            ahead = "" if newest.revision == pin.revision else f", not {unpinned} (what it reads without the pin)"
            lines.append(f"{head} This plan, like the reconcile job, works from the pinned revision{ahead}, "
                         "until `fleetllm unpin`.")
        else:
            lines.append(f"{head} This plan shows {fleet.revision[:12]} as asked (--against REV); the reconcile "
                         f"job works from the pinned revision {pin.revision[:12]} until `fleetllm unpin`, "
                         "whatever is merged.")
    suspended = controls.suspended
    if suspended is not None:
        lines.append(f"The fleet is SUSPENDED {_since(suspended.at, suspended.actor, suspended.reason)}. The "
                     "reconcile job and apply write none of this plan to LiteLLM until `fleetllm resume`.")
    return "\n".join(lines) or None


def print_note(note: str | None, fmt: str = "text") -> None:
    """A note before the plan: on stdout with the text plan, on stderr beside a JSON one (stdout stays one
    JSON document)."""
    if note is not None:
        print(note + ("\n" if fmt == "text" else ""), file=sys.stderr if fmt == "json" else sys.stdout)


def print_outcome(outcome: PassOutcome, fmt: str = "text", *, plan: bool = True) -> None:
    """The plan (unless `plan` is false: `apply` showed it before asking), then each write's result."""
    if plan:
        print(render_json(outcome.plan, outcome.intended) if fmt == "json" else
              render_text(outcome.plan, outcome.intended))
    for result in outcome.results:
        mark = "ok" if result.ok else "FAILED"
        detail = f": {result.error}" if result.error else ""
        print(f"  {mark:6} {result.action.kind:7} {result.action.id}  {result.outcome}{detail}",
              file=sys.stderr if fmt == "json" else sys.stdout)


def apply_exit_code(outcome: PassOutcome) -> int:
    failed = any(not r.ok for r in outcome.results)
    return EXIT_ERROR if failed or outcome.plan.errors or outcome.plan.blocked else EXIT_OK


