"""One reconcile pass: intended state -> observation -> verdicts -> plan -> (apply) -> record.

`plan` mode observes and plans but writes nothing (not even the probe history); `apply` mode executes
the plan, then persists the advanced histories, the pending deletes and the pass record. A recorded
plan (`reconcile.dry_run`, the demo) writes nothing to LiteLLM but keeps the histories, so verdicts
that need several passes (Stalled, Missing) come out as they would, and the record with the planned
actions; pending deletes do not advance, since nothing was deleted.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp

from fleetllm.adapters.http import connector
from fleetllm.adapters.litellm import LitellmApi
from fleetllm.adapters.state.passes import PassRecord
from fleetllm.adapters.state.reconcile import ReconcileState
from fleetllm.core.fleet.model import Fleet
from fleetllm.core.fleet.render import Bearers
from fleetllm.core.judge.adopt import adopt
from fleetllm.core.judge.adoption import AdoptSource
from fleetllm.core.judge.assess import assess
from fleetllm.core.judge.intended import Intended, intended_state
from fleetllm.core.judge.observed import Observation
from fleetllm.core.judge.ownership import claim_of, fleet_identity
from fleetllm.core.judge.plan import ActionKind, Plan, make_plan
from fleetllm.core.rollout.model import Step
from fleetllm.core.rollout.transitions import RolloutChange
from fleetllm.job.apply import ActionResult, apply_plan, next_pending
from fleetllm.job.observer import Observer
from fleetllm.job.record import cost_record, pass_record
from fleetllm.job.rollout import Begun, RolloutDriver, drain_actions, rollout_record, unlisted, without
from fleetllm.job.saved import SavedPlan
from fleetllm.logs import get_logger, log_event
from fleetllm.settings import DEFAULTS

LOG = get_logger("reconcile")

ApiFactory = Callable[[aiohttp.ClientSession], LitellmApi]


@dataclass(frozen=True)
class PassOutcome:
    intended: Intended
    plan: Plan
    results: tuple[ActionResult, ...]
    record: PassRecord
    observation: Observation
    rollout: Step | None = None  # the staged rollout's step (None: no rollout store)


@dataclass
class Reconciler:
    bearers: Bearers
    observer: Observer
    api_factory: ApiFactory
    store: ReconcileState
    write_concurrency: int = DEFAULTS["/litellm/write_concurrency"]  # the schema's, as the settings'
    clock: Callable[[], float] = field(default=time.time)
    rollout: RolloutDriver | None = None  # staged rollouts (issue 14): without it every box gets the head

    def _bearer_for(self, fleet: Fleet) -> Callable[[str, int], str | None]:
        def bearer(box: str, port: int) -> str | None:
            if fleet.settings.is_legacy(box, port):
                return self.bearers.legacy_key
            return self.bearers.salt.derive(box, port)
        return bearer

    async def run_pass(self, fleet: Fleet, *, apply: bool, saved: SavedPlan | None = None,
                       record: bool | None = None, adopt_from: AdoptSource | None = None,
                       prune_adopted: bool = False, invalid_head: tuple[str, tuple[str, ...]] | None = None,
                       suspended: bool = False) -> PassOutcome:
        """With `saved` (a plan file), apply only if this pass plans exactly the same actions: StalePlan
        otherwise, before any write and before any state is saved. `record` (default: `apply`) keeps
        the histories and the pass record. `adopt_from`: also adopt that owner's deployments
        (reconcile.adopt), deleting them after fleetllm's own exist. `invalid_head`: (revision, errors) of a
        branch head that is not valid, so this pass runs on `fleet`, the last valid commit (the record says so).
        `suspended`: the pass does not apply because the fleet is suspended (its record's mode says so)."""
        record = apply if record is None else record
        started = self.clock()
        intended = intended_state(fleet, self.bearers)  # RenderError: the pass does not run at all
        begun: Begun | None = None
        if self.rollout is not None:  # agent-managed boxes: their servers as released, not the head's
            begun = self.rollout.begin(fleet, started)
            intended = self.rollout.compose(begun, intended)
        pool = connector(limit=max(self.observer.probe_concurrency, self.write_concurrency) + 8)
        async with aiohttp.ClientSession(connector=pool) as session:
            api = self.api_factory(session)
            observation = await self.observer.observe(session, intended, api, self.store.box_facts(),
                                                      self._bearer_for(fleet))
            # Whose deployments this pass writes (FleetIdError: a new fleet without fleet_id, nothing planned).
            identity = fleet_identity(fleet.settings.fleet_id, fleet.origin, observation.deployments,
                                      claim_of(intended).boxes, self.store.recorded_fleet_id())
            intended = dataclasses.replace(intended, fleet_id=identity.fleet_id)
            assessment = assess(intended, observation, self.store.histories())
            pending = self.store.pending_deletes()
            stepped: Step | None = None
            if self.rollout is not None and begun is not None:
                stepped = self.rollout.step(begun, assessment, observation, self.clock(), claim_of(intended))
                drains = frozenset(d.id for d in observation.deployments or () if d.id in stepped.held_out)
                plan = make_plan(without(intended, stepped.held_out), unlisted(observation, drains), assessment,
                                 pending)
                plan = drain_actions(plan, observation, drains, stepped)  # on purpose: no delete budget
            else:
                plan = make_plan(intended, observation, assessment, pending)
            if identity.note is not None:  # said on every pass (the plan's text, the log) until fleet.yaml has it
                plan = dataclasses.replace(plan, warnings=(*plan.warnings, identity.note))
                log_event(LOG, "fleet id derived", logging.WARNING, fleet_id=identity.fleet_id, what=identity.note)
            if adopt_from is not None:
                plan = adopt(plan, intended, observation, assessment, adopt_from, prune_adopted=prune_adopted)
            if saved is not None:
                saved.check(plan)
            results: tuple[ActionResult, ...] = ()
            if apply:
                results = await apply_plan(plan, api, self.write_concurrency)
        if record:
            self.store.save_histories(assessment.histories)
            if identity.settled and identity.fleet_id is not None:  # the fleet's own history of its id
                self.store.record_fleet_id(identity.fleet_id, fleet.revision, self.clock())
        if apply and observation.deployments is not None:
            self.store.save_pending_deletes(next_pending(pending, plan, results, self.clock()))
        changes: tuple[RolloutChange, ...] = ()  # the rollout's transitions: only a pass that records its step
        if apply and self.rollout is not None and begun is not None and stepped is not None:
            changes = self.rollout.save(begun, stepped, remaining_deployments(observation, results), self.clock())
        record_ = pass_record(started, round(self.clock() - started, 3), apply=apply, intended=intended,
                              observation=observation, plan=plan, results=results, suspended=suspended)
        if stepped is not None:
            record_ = dataclasses.replace(record_, rollout=rollout_record(stepped, changes))
        record_ = dataclasses.replace(record_, cost=cost_record(fleet, observation))
        if invalid_head is not None:
            record_ = dataclasses.replace(record_, head=invalid_head[0], head_errors=invalid_head[1])
        outcome = PassOutcome(intended, plan, results, record_, observation, stepped)
        if record:
            self.store.record_pass(outcome.record)
        return outcome


def remaining_deployments(observation: Observation, results: tuple[ActionResult, ...]) -> frozenset[str] | None:
    """The fleetllm deployments LiteLLM holds after this pass's writes: those listed, less the ones this pass
    deleted (None: LiteLLM was not listed). A box that left the placement retires only once none is left."""
    if observation.deployments is None:
        return None
    deleted = {r.action.id for r in results if r.ok and r.action.kind is ActionKind.DELETE}
    return frozenset(d.id for d in observation.deployments if d.managed and d.id not in deleted)
