"""The rollout inside a reconcile pass (issue 14): which boxes are agent-managed, the intended state as
the union of what each box is released (not the branch head), the step, the deliberate drains and the
durable state.

Order in a pass: `begin` (before observing: the releases decide which servers are intended), observe and
judge, `step` (with the verdicts and LiteLLM's deployments), then the plan without the held-out servers,
the drains (deleted on purpose, never held by the delete budget), and `save` after the LiteLLM writes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Protocol

from fleetllm.adapters.state.passes import RolloutPassRecord
from fleetllm.adapters.state.store import ReportStore, RolloutStore
from fleetllm.core.boxreport import BoxReport
from fleetllm.core.fleet.model import Fleet, RolloutMode
from fleetllm.core.fleet.render import Bearers, RenderError
from fleetllm.core.judge.assess import Assessment
from fleetllm.core.judge.intended import ID_PREFIX, Intended, deployment_id, intended_state
from fleetllm.core.judge.observed import Observation
from fleetllm.core.judge.ownership import Claim, writable
from fleetllm.core.judge.plan import ORDER, Action, ActionKind, Plan
from fleetllm.core.judge.verdict import SERVING, serving_now
from fleetllm.core.rollout.configs import box_config
from fleetllm.core.rollout.control import Request, apply_request
from fleetllm.core.rollout.model import (
    BoxConfig,
    BoxInput,
    BoxRelease,
    ReportFacts,
    Rollout,
    Step,
    StepInput,
)
from fleetllm.core.rollout.retire import EmptyReport, RetireInput, Retirement, RetireState, RetireStep, retire_step
from fleetllm.core.rollout.step import step
from fleetllm.core.rollout.transitions import RolloutChange, pass_transitions
from fleetllm.logs import get_logger, log_event
from fleetllm_contract.report import ReportOutcome

LOG = get_logger("rollout")

FleetAt = Callable[[str], Fleet | None]  # the valid fleet at a revision (None: unreadable or invalid)


class RolloutBackend(RolloutStore, ReportStore, Protocol):
    """What the rollout reads and writes: the state store (SqlStateStore implements it)."""


def is_agent(report: BoxReport | None) -> bool:
    """The box's latest report was sent by the box agent (or an installer that installed it)."""
    return report is not None and (report.agent or report.body.get("agent") is True)


def report_facts(report: BoxReport | None) -> ReportFacts | None:
    if report is None:
        return None
    failed = report.outcome in (ReportOutcome.FAILED, ReportOutcome.FIT_FAILED)
    return ReportFacts(report.revision, install_failed=failed, failed=report.failed_servers(),
                       reported_at=report.received_at)


def managed_boxes(target: Fleet, reports: Mapping[str, BoxReport], releases: Mapping[str, BoxRelease]) -> set[str]:
    """Agent-managed boxes: rollout mode auto at the target and the latest report says agent. A box that
    left the placement stays managed while it has a release: the rollout drains its servers' deployments
    and releases it the target; then it retires (`retire`: served a box JSON with no servers, then
    forgotten)."""
    boxes = {b for b in target.boxes if target.rollout_mode(b) is RolloutMode.AUTO and is_agent(reports.get(b))}
    boxes |= {b for b in releases if b not in target.boxes and is_agent(reports.get(b))}
    return boxes


@dataclass
class Begun:
    """The rollout as a pass found it, before observing."""

    target: Fleet
    rollout: Rollout | None  # as the step sees it: the stored one with a person's request applied
    request: Request | None
    releases: dict[str, BoxRelease]
    reports: dict[str, BoxReport]
    managed: set[str]
    fleets: dict[str, Fleet | None] = field(default_factory=dict)  # revision -> fleet
    intended: Intended | None = None
    stored: Rollout | None = None  # the rollout as the store held it (before the request)
    retirements: dict[str, Retirement] = field(default_factory=dict)


@dataclass
class RolloutDriver:
    store: RolloutBackend
    fleet_at: FleetAt
    bearers: Bearers

    def _fleet(self, begun: Begun, revision: str) -> Fleet | None:
        if revision == begun.target.revision:
            return begun.target
        if revision not in begun.fleets:
            begun.fleets[revision] = self.fleet_at(revision) if revision else None
        return begun.fleets[revision]

    def begin(self, target: Fleet, now: float) -> Begun:
        stored, request, actor = self.store.current_rollout()
        rollout = stored
        if rollout is not None and request is not None:
            rollout = apply_request(rollout, request, actor or "someone", now)
        retirements = self.store.retirements()
        # A retired box (forgotten by `rollout forget` meanwhile) is no longer the rollout's.
        releases = {b: r for b, r in self.store.box_releases().items() if b in target.boxes
                    or b not in retirements or retirements[b].state is not RetireState.RETIRED}
        reports = self.store.latest_reports()
        return Begun(target, rollout, request, releases, reports, managed_boxes(target, reports, releases),
                     stored=stored, retirements=retirements)

    def released_revision(self, begun: Begun, box: str) -> str:
        release = begun.releases.get(box)
        if release is not None:
            return release.revision
        report = begun.reports.get(box)
        return report.revision if report is not None else begun.target.revision

    def compose(self, begun: Begun, head: Intended) -> Intended:
        """The intended state: the head's servers, but each agent-managed box's from its released revision."""
        servers = {k: s for k, s in head.servers.items() if s.box not in begun.managed}
        for box in sorted(begun.managed):
            fleet = self._fleet(begun, self.released_revision(begun, box))
            if fleet is not None and fleet.box(box) is None:
                continue  # not placed at its released revision: it serves nothing of ours
            try:
                at_release = intended_state(_only(fleet, box), self.bearers) if fleet is not None else None
            except RenderError:
                at_release = None
            if at_release is None:  # unreadable now: keep the head's servers rather than prune the box's
                servers.update({k: s for k, s in head.servers.items() if s.box == box})
                continue
            servers.update(at_release.servers)
        begun.intended = replace(head, servers=servers)
        return begun.intended

    def _config(self, begun: Begun, box: str, revision: str | None) -> BoxConfig | None:
        if not revision:
            return None
        fleet = self._fleet(begun, revision)
        if fleet is None:
            return None
        try:
            return box_config(fleet, box, self.bearers, deployment_id)
        except RenderError:
            return None

    def step_input(self, begun: Begun, assessment: Assessment, observation: Observation, now: float,
                   claim: Claim) -> StepInput:
        target = begun.target
        boxes: dict[str, BoxInput] = {}
        for box in sorted(set(target.boxes) | begun.managed):
            managed = box in begun.managed
            release = begun.releases.get(box)
            released = self.released_revision(begun, box)
            target_config = self._config(begun, box, target.revision)
            placed = target.box(box)
            reported = self._fleet(begun, released) if managed and release is None else None
            at_release = self._fleet(begun, released) if managed and release is not None else None
            boxes[box] = BoxInput(
                left=placed is None and at_release is not None and at_release.box(box) is None,
                box=box, managed=managed, target=target_config, new=reported is not None and reported.box(box) is None,
                released=self._config(begun, box, released) if managed else target_config,
                last_good=self._config(begun, box, release.last_good if release is not None else released)
                if managed else target_config,
                report=report_facts(begun.reports.get(box)),
                card_gb=placed.card_gb if placed is not None else None)
        # A server serving only by hysteresis (no probe succeeded this pass: restarting, loading) does not
        # serve: the one rule the deployment planner routes by too (core.judge.verdict.serving_now).
        verdicts = {key: "Down" if j.verdict in SERVING and not serving_now(j.verdict, observation.probes.get(key))
                    else str(j.verdict) for key, j in assessment.judgements.items()}
        routed = (None if observation.deployments is None
                  else frozenset(d.id for d in observation.deployments if writable(d, claim)))
        budgets = {model: target.max_unavailable(model) for model in target.recipes}
        return StepInput(target=target.revision, now=now, boxes=boxes, releases=dict(begun.releases),
                         rollout=begun.rollout, verdicts=verdicts, routed=routed, max_unavailable=budgets,
                         drain_s=target.settings.rollout.drain_s, boxes_route=observation.boxes_route,
                         in_flight=observation.in_flight)

    def step(self, begun: Begun, assessment: Assessment, observation: Observation, now: float,
             claim: Claim) -> Step:
        """`claim`: what the fleet owns in LiteLLM (a deployment routes one of its servers only if it is its own)."""
        return step(self.step_input(begun, assessment, observation, now, claim))

    def retire(self, begun: Begun, result: Step, remaining: frozenset[str] | None, now: float) -> RetireStep:
        """Retirement's pass (core.rollout.retire) after the step and this pass's LiteLLM writes.
        `remaining`: the deployment ids LiteLLM still holds (None: it was not listed)."""
        target = begun.target
        known = {b: r.revision for b, r in begun.reports.items()}
        known.update({b: r.revision for b, r in begun.releases.items()})
        reports = {b: EmptyReport(r.revision, r.received_at, r.runs_nothing()) for b, r in begun.reports.items()}
        boxes_left = None if remaining is None else frozenset(b for i in remaining if (b := deployment_box(i)))
        return retire_step(RetireInput(
            target=target.revision, placed=frozenset(target.boxes), known=known, retirements=begun.retirements,
            reports=reports, released_target=frozenset(b for b, r in result.releases.items()
                                                        if r.revision == target.revision),
            managed=frozenset(begun.releases), remaining=boxes_left, now=now,
            retire_s=target.settings.rollout.retire_s))

    def save(self, begun: Begun, result: Step, remaining: frozenset[str] | None = None,
             now: float | None = None) -> tuple[RolloutChange, ...]:
        """Record the step and retirement's pass; returns the rollout's transitions this pass made (announced
        by the runner: fleetllm.job.notify, the forge's commit statuses). Only a pass that records its step
        has any. `remaining`: the deployment ids LiteLLM holds after this pass's writes (None: unknown)."""
        retired = self.retire(begun, result, remaining, result.rollout.updated_at if now is None else now)
        releases = {b: r for b, r in result.releases.items() if b not in retired.forget}
        placed_again = frozenset(b for b in begun.retirements if b in begun.target.boxes)
        self.store.save_rollout(result.rollout, releases, taken=begun.request, retirements=retired.changed,
                                placed_again=placed_again)
        for box, record in sorted(retired.changed.items()):
            log_event(LOG, f"box {record.state}", box=box, left_at_revision=record.revision, reason=record.reason
                      or None, forgotten=box in retired.forget)
        changes = pass_transitions(begun.stored, begun.rollout, result.rollout)
        for change in changes:
            log_event(LOG, "rollout transition", transition=str(change.transition), target=change.target,
                      reason=change.reason or None, waves=change.waves, by=change.by or None)
        if result.halt is not None:
            log_event(LOG, "rollout halted", logging.ERROR, box=result.halt.box, target=result.rollout.target,
                      reason=result.halt.reason, rolled_back_to=result.halt.rolled_back_to)
        for box, revision in sorted(result.released.items()):
            if box not in result.rollbacks:
                log_event(LOG, "box released", box=box, revision=revision, target=result.rollout.target,
                          wave=result.releases[box].wave)
        return changes


def deployment_box(deployment: str) -> str | None:
    """The box a fleetllm deployment id names (`fleetllm:<box>:<port>`: intended.deployment_id), None for
    another id."""
    prefix, _, rest = deployment.partition(":")
    box, _, port = rest.rpartition(":")
    return box if prefix == ID_PREFIX and box and port.isdigit() else None


def _only(fleet: Fleet, box: str) -> Fleet:
    """The fleet with one box (its servers rendered at that revision)."""
    return replace(fleet, boxes={box: fleet.boxes[box]})


def without(intended: Intended, held_out: frozenset[str]) -> Intended:
    """The intended state minus servers whose deployment is held out of LiteLLM (draining)."""
    return replace(intended, servers={k: s for k, s in intended.servers.items() if s.id not in held_out})


def unlisted(observation: Observation, ids: frozenset[str]) -> Observation:
    """The observation without the deployments the rollout deletes itself (the planner leaves them)."""
    if observation.deployments is None or not ids:
        return observation
    return replace(observation, deployments=tuple(d for d in observation.deployments if d.id not in ids))


def drain_actions(plan: Plan, observation: Observation, drains: frozenset[str], stepped: Step) -> Plan:
    """The plan with the rollout's drains added: deletes on purpose, after the plan's valves (a drain is
    never held by the delete budget). Only deployments LiteLLM lists are deleted."""
    if not drains or observation.deployments is None:
        return plan
    listed = {d.id: d for d in observation.deployments}
    added = tuple(Action(ActionKind.DELETE, i, listed[i].model_name,
                         f"rollout drain toward {stepped.rollout.target[:12]}: deleted on purpose before its box "
                         "restarts (not held by the delete budget)", before=listed[i])
                  for i in sorted(drains) if writable(listed[i], plan.claim))
    actions = sorted((*plan.actions, *added), key=lambda a: (ORDER[a.kind], a.id))
    return replace(plan, actions=tuple(actions))


def rollout_record(stepped: Step, changes: tuple[RolloutChange, ...] = ()) -> RolloutPassRecord:
    r = stepped.rollout
    return RolloutPassRecord(
        target=r.target, state=str(r.state), reason=r.reason, waves=r.waves, released=dict(stepped.released),
        drained=tuple(sorted(stepped.drain)), held_out=tuple(sorted(stepped.held_out)),
        rollbacks=dict(stepped.rollbacks), boxes={b: str(s.state) for b, s in stepped.status.items()},
        out={m: tuple(f"{b}:{p}" for b, p in keys) for m, keys in stepped.out.items()},
        halt=stepped.halt.reason if stepped.halt is not None else "", changes=changes)
