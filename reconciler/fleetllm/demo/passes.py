"""Reconcile passes for the demo: the reconciler's own engine (observe, judge, plan, apply) over the
control plane's config and state store, one pass at a time under the same lock as `fleetllm apply`.

With a LiteLLM proxy a pass applies its plan. Without one the demo plans only, against an empty
LiteLLM that takes no writes (`NoLitellm`): the plan then says what a fresh proxy would get. Such a
pass is recorded like a `reconcile.dry_run` pass (mode "plan": the probe histories and the record with
its planned actions), so the status page shows the verdicts and what a proxy would be sent.

A rollout scenario without a proxy cannot plan only: a staged rollout releases a box only once the
servers it waits for are routed, and moves on only when passes apply. Its passes apply to a routing
table kept in the demo's memory (`MemoryLitellm`: nothing is sent anywhere, no caller can use it).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from fleetllm.adapters.git import read_fleet
from fleetllm.adapters.litellm import LitellmApi, LitellmError
from fleetllm.adapters.state import open_store
from fleetllm.adapters.state.control import pin_of
from fleetllm.adapters.state.sqlstore import SqlStateStore
from fleetllm.core.fleet.diagnostics import format_text
from fleetllm.core.fleet.model import Fleet
from fleetllm.core.fleet.validate import validate_snapshot
from fleetllm.core.judge.intended import DeploymentSpec
from fleetllm.core.judge.observed import Deployment
from fleetllm.demo.fleet import DemoError
from fleetllm.demo.litellm import Litellm
from fleetllm.demo.workspace import Workspace
from fleetllm.errors import LockHeld, SourceError
from fleetllm.job.configfile import ReconcileConfig
from fleetllm.job.configfile import load_config as reconcile_config
from fleetllm.job.engine import PassOutcome, Reconciler
from fleetllm.job.wiring import build_reconciler, rollout_driver

PLAN_ONLY = "plan-only: no LiteLLM given, nothing is written"


class NoLitellm:
    """An empty LiteLLM that refuses every write: what plan-only passes plan against."""

    async def list_deployments(self) -> tuple[Deployment, ...]:
        return ()

    async def get(self, deployment_id: str) -> Deployment | None:
        return None

    async def create(self, spec: DeploymentSpec) -> None:
        raise LitellmError(PLAN_ONLY)

    async def update(self, spec: DeploymentSpec) -> None:
        raise LitellmError(PLAN_ONLY)

    async def delete(self, deployment_id: str) -> bool:
        raise LitellmError(PLAN_ONLY)


def _plan_only(_session: object) -> LitellmApi:
    return NoLitellm()


class MemoryLitellm:
    """LiteLLM's deployment table in memory: what a rollout scenario without a proxy applies to."""

    def __init__(self) -> None:
        self.table: dict[str, Deployment] = {}

    async def list_deployments(self) -> tuple[Deployment, ...]:
        return tuple(self.table.values())

    async def get(self, deployment_id: str) -> Deployment | None:
        return self.table.get(deployment_id)

    async def create(self, spec: DeploymentSpec) -> None:
        self.table[spec.id] = Deployment(spec.id, spec.model_name, spec.model_info, spec.api_base)

    async def update(self, spec: DeploymentSpec) -> None:
        await self.create(spec)

    async def delete(self, deployment_id: str) -> bool:
        return self.table.pop(deployment_id, None) is not None


@dataclass
class Passes:
    workspace: Workspace
    litellm: Litellm | None
    fleet: Fleet | None = None  # the last valid commit of main
    last: PassOutcome | None = None
    reconciler: Reconciler | None = None
    store: SqlStateStore | None = None  # the control plane's state store
    invalid: tuple[str, str] | None = None  # main's head when it is not valid, and why
    memory: MemoryLitellm | None = None  # without a proxy, for a rollout scenario: the table it applies to
    fleets: dict[str, Fleet | None] = field(default_factory=dict)  # valid fleets by commit (boxes' releases)

    @property
    def apply(self) -> bool:
        return self.litellm is not None or self.memory is not None

    def _config(self) -> ReconcileConfig:
        # Exactly what `fleetllm plan --config` (and with LiteLLM, `reconcile --config`) reads.
        return reconcile_config(self.workspace.config)

    def _load_fleet(self) -> Fleet:
        try:
            validation = validate_snapshot(read_fleet(str(self.workspace.fleet), "main"))
        except SourceError:
            validation = None
        if validation is not None and validation.fleet is not None:
            self.fleet = validation.fleet
            self.invalid = None
        elif validation is not None:
            self.invalid = (validation.revision, format_text(validation.errors))
        if self.fleet is None:
            raise DemoError(f"{self.workspace.fleet}: no valid commit on main")
        return self.fleet

    def fleet_at(self, revision: str) -> Fleet | None:
        """The valid fleet at a commit (a box's released revision), as `fleetllm reconcile` reads it; kept."""
        if revision not in self.fleets:
            try:
                self.fleets[revision] = validate_snapshot(read_fleet(str(self.workspace.fleet), revision)).fleet
            except SourceError:
                return None
        return self.fleets[revision]

    def run(self) -> PassOutcome | None:
        """One pass; None when another pass (a `fleetllm apply` in another terminal) holds the lock."""
        fleet = self._load_fleet()
        if self.reconciler is None:
            self.store = open_store(self.workspace.state_url, application_name="fleetllm-demo")
            self.reconciler = build_reconciler(self._config(), fleet.settings.reconcile, self.store)
            # Staged rollouts, as `fleetllm reconcile` runs them: agent boxes are released box by box.
            self.reconciler.rollout = rollout_driver(self.store, self.fleet_at, self.reconciler.bearers)
            if self.litellm is None:
                memory = self.memory
                self.reconciler.api_factory = _plan_only if memory is None else lambda _session: memory
        reconciler, store = self.reconciler, self.store
        assert store is not None
        # The fleet controls (fleetllm sync|suspend|pin), as `fleetllm reconcile` honours them.
        store.take_sync_request()  # the demo passes every few seconds anyway
        suspended = store.control().suspended is not None
        pin = pin_of(store)
        if pin is not None and pin.revision != fleet.revision:
            pinned = validate_snapshot(read_fleet(str(self.workspace.fleet), pin.revision)).fleet
            fleet = pinned if pinned is not None else fleet
        reconciler.observer.probe_timeout_s = fleet.settings.reconcile.probe_timeout_s
        reconciler.observer.probe_concurrency = fleet.settings.reconcile.probe_concurrency
        try:
            with store.pass_lock():
                outcome = asyncio.run(reconciler.run_pass(fleet, apply=self.apply and not suspended, record=True))
        except LockHeld:
            return None
        self.last = outcome
        return outcome

    def close(self) -> None:
        if self.store is not None:
            self.store.close()
