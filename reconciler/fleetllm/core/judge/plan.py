"""The planner: from the intended state, what was observed and the verdicts, the exact list of LiteLLM
writes that make "a deployment exists exactly for the servers that serve" true. Pure.

Order: creates, updates and replacements first, prunes last, so a model that moves gains its new
deployment before it loses the old one. Safety valves, all of which hold deletes and say why:
- any listing failed (a provider's or LiteLLM's): no delete at all;
- more deletes than the budget allows (`max_deletes_per_pass`, and `max_delete_fraction` of the managed
  deployments, at least one): no delete at all this pass;
- `prune: false`, or the server's box or model is `reconcile: paused`;
- a deployment without our marker is never written, only reported as drift.
A server whose observation failed (Unknown) keeps whatever deployment it has. A serving server without a
deployment gets one only when a probe of this pass succeeded (`verdict.serving_now`, the rule the rollout
step counts servers up by): one Healthy only by hysteresis keeps a deployment but is never given one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType

from fleetllm.core.fleet.model import Provider
from fleetllm.core.judge.adoption import Adoption
from fleetllm.core.judge.assess import Assessment
from fleetllm.core.judge.intended import (
    ID_PREFIX,
    INFO_BEARER,
    INFO_FLEET,
    INFO_PARAMS,
    DeploymentSpec,
    Intended,
    IntendedServer,
    ServerKey,
)
from fleetllm.core.judge.observed import Deployment, Observation, ProbeStatus, assumed_mapping
from fleetllm.core.judge.ownership import Claim, Owner, claim_of, owner, recorded_fleet, writable
from fleetllm.core.judge.verdict import NOT_SERVING, SERVING, Judgement, Verdict, serving_now


class ActionKind(StrEnum):
    CREATE = "create"
    UPDATE = "update"
    REPLACE = "replace"  # delete then create under the same id: PATCH merges, so a removed param needs it
    DELETE = "delete"


ORDER = {ActionKind.CREATE: 0, ActionKind.UPDATE: 1, ActionKind.REPLACE: 2, ActionKind.DELETE: 3}


@dataclass(frozen=True)
class Action:
    kind: ActionKind
    id: str
    model_name: str
    reason: str
    after: DeploymentSpec | None = None  # create, update, replace
    before: Deployment | None = None  # update, replace, delete
    changes: tuple[str, ...] = ()
    adopted: bool = False  # a delete of another owner's deployment (llmao's), planned by reconcile.adopt
    requires: str | None = None  # deleted only once this fleetllm deployment is in LiteLLM (make-before-break)


@dataclass(frozen=True)
class Held:
    """An action the planner would take but a safety valve or a pause holds back."""

    kind: ActionKind
    id: str
    model_name: str
    reason: str


@dataclass(frozen=True)
class Drift:
    id: str
    model_name: str
    reason: str


@dataclass(frozen=True)
class PendingDelete:
    """A delete that failed in an earlier pass: retried until the deployment is gone."""

    id: str
    attempts: int
    last_error: str
    first_failed_at: float


@dataclass(frozen=True)
class Plan:
    revision: str
    observed_at: float
    actions: tuple[Action, ...]
    held: tuple[Held, ...] = ()
    drift: tuple[Drift, ...] = ()
    blocked: tuple[str, ...] = ()  # why deletes were held as a whole
    errors: tuple[str, ...] = ()  # observation failures
    judgements: Mapping[ServerKey, Judgement] = field(default_factory=lambda: MappingProxyType({}))
    adoptions: tuple[Adoption, ...] = ()  # `--adopt SOURCE`: the fate of each of that owner's deployments
    adopt_source: str | None = None
    litellm_error: str | None = None  # LiteLLM was not listed (unreachable, or not configured): no plan at all
    # Serving servers that no deployment in LiteLLM routes to now, and why (a create planned, a deployment
    # under fleetllm's id without the marker, a held create, no public endpoint). Empty when not listed.
    unrouted: Mapping[ServerKey, str] = field(default_factory=lambda: MappingProxyType({}))
    warnings: tuple[str, ...] = ()  # e.g. a provider's port mapping assumed (no key configured)
    claim: Claim = field(default_factory=lambda: Claim(None))  # what the fleet owns: apply re-reads by it

    @property
    def listed(self) -> bool:
        """Whether LiteLLM's deployments were known: without them there is no plan, only verdicts."""
        return self.litellm_error is None

    @property
    def empty(self) -> bool:
        return not self.actions

    def count(self, *kinds: ActionKind) -> int:
        return sum(1 for a in self.actions if a.kind in kinds)

    @property
    def summary(self) -> tuple[int, int, int]:
        """Terraform's (to add, to change, to destroy); a replacement counts as one add and one destroy."""
        add = self.count(ActionKind.CREATE, ActionKind.REPLACE)
        destroy = self.count(ActionKind.DELETE, ActionKind.REPLACE)
        return add, self.count(ActionKind.UPDATE), destroy


def update_changes(before: Deployment, after: DeploymentSpec, revision: str) -> tuple[list[str], bool]:
    """What differs, and whether PATCH can do it (it merges litellm_params: a removed param needs a
    replace; a new model_name it does take)."""
    changes: list[str] = []
    replace = False
    fleet = after.model_info.get(INFO_FLEET)
    if fleet is not None and recorded_fleet(before) is None:
        changes.append(f"adopted into fleet {fleet} in place (written before fleet ids)")
    if before.model_name != after.model_name:
        changes.append(f"model_name {before.model_name} -> {after.model_name}")
    old_base = before.recorded_api_base
    if old_base != after.api_base:
        changes.append(f"api_base {old_base} -> {after.api_base} (public port remapped)")
    if before.recorded_bearer != after.model_info.get(INFO_BEARER):
        changes.append("bearer changed (salt rotated or legacy key changed)")
    written = after.model_info.get(INFO_PARAMS)
    removed = before.recorded_params - set(written if isinstance(written, tuple) else ())
    if removed:
        changes.append("litellm_params removed: " + ", ".join(sorted(removed)))
        replace = True
    if not changes:
        changes.append(f"route fields changed in the repository (revision {revision[:12]})")
    return changes, replace


def _orphan_reason(deployment: Deployment, intended: Intended) -> str:
    key = deployment.recorded_key
    if not deployment.id.startswith(ID_PREFIX + ":") or key is None:
        return "managed by fleetllm but not a deployment id fleetllm makes"
    if key[0] not in {s.box for s in intended.servers.values()}:
        return f"box {key[0]} was removed from the repository"
    return f"server {key[0]}:{key[1]} was removed from the repository"


def _replacement_coming(model: str, intended: Intended, judgements: Mapping[ServerKey, Judgement]) -> bool:
    """True when the model has servers in the repo but none serves yet, and some are on their way."""
    verdicts = [judgements[s.key].verdict for s in intended.by_model(model)]
    return (bool(verdicts) and not any(v in SERVING for v in verdicts)
            and any(v in (Verdict.PENDING, Verdict.LOADING, Verdict.UNKNOWN) for v in verdicts))


def delete_budget(settings_max: int, fraction: float, managed: int) -> int:
    return min(settings_max, max(1, math.floor(fraction * managed)))


def make_plan(intended: Intended, observation: Observation, assessment: Assessment,
              pending: Mapping[str, PendingDelete] | None = None) -> Plan:
    judgements = assessment.judgements
    errors = tuple(observation.failed_listings)
    warnings = _assumed_warnings(intended, observation)
    if observation.deployments is None:
        return Plan(intended.revision, observation.observed_at, (), errors=errors, judgements=judgements,
                    claim=claim_of(intended),
                    litellm_error=observation.litellm_error or "the LiteLLM listing failed", warnings=warnings)
    listed = {d.id: d for d in observation.deployments}
    claim = claim_of(intended)
    actions: list[Action] = []
    held: list[Held] = []
    drift: list[Drift] = []
    unrouted: dict[ServerKey, str] = {}

    def propose(action: Action, server: IntendedServer) -> None:
        if server.paused:
            held.append(Held(action.kind, action.id, action.model_name, "reconcile: paused (box or model)"))
        else:
            actions.append(action)

    for key, server in sorted(intended.servers.items()):
        judgement = judgements[key]
        existing = listed.get(server.id)
        if existing is not None and not writable(existing, claim):
            whose = _not_ours(existing, claim)
            drift.append(Drift(existing.id, existing.model_name, f"has fleetllm's id for {server.box}:{server.port} "
                               f"but {whose}: not touched"))
            if judgement.verdict in SERVING:
                unrouted[key] = (f"LiteLLM holds {existing.id} without fleetllm's managed_by marker, so fleetllm "
                                 "neither uses nor replaces it: delete it in LiteLLM and the next apply creates "
                                 "fleetllm's own" if not existing.managed else
                                 f"LiteLLM holds {existing.id}, {whose}, so this fleet neither uses nor replaces "
                                 "it: take the box out of the other fleet, or delete the deployment in LiteLLM, "
                                 "and the next apply creates this fleet's own")
            continue
        if judgement.verdict in SERVING:
            spec = assessment.desired.get(key)
            if spec is None:
                # Serving by hysteresis while its public endpoint is unknown this pass (not in the listing,
                # ports not published yet): keep what LiteLLM has; there is nothing to create it with.
                if existing is None:
                    unrouted[key] = "no deployment, and its public endpoint is unknown this pass: none can be made"
                continue
            if existing is None:
                if not serving_now(judgement.verdict, observation.probes.get(key)):
                    # Serving only by hysteresis (e.g. released from a halted rollout's hold while it
                    # crash-loops): never routed until a probe of this pass succeeds.
                    unrouted[key] = ("no deployment, and no probe succeeded this pass (serving only by "
                                     "hysteresis): created once a probe succeeds")
                    continue
                unrouted[key] = ("no deployment yet: held, reconcile: paused" if server.paused
                                 else "no deployment yet: `fleetllm apply` creates it")
                propose(Action(ActionKind.CREATE, server.id, server.model, f"{judgement.verdict}: {judgement.reason}",
                               after=spec), server)
            elif existing.spec != spec.spec:
                changes, replace = update_changes(existing, spec, intended.revision)
                kind = ActionKind.REPLACE if replace else ActionKind.UPDATE
                propose(Action(kind, server.id, server.model, "; ".join(changes), after=spec, before=existing,
                               changes=tuple(changes)), server)
        elif judgement.verdict in NOT_SERVING and existing is not None:
            propose(Action(ActionKind.DELETE, server.id, existing.model_name,
                           f"{judgement.verdict}: {judgement.reason}", before=existing), server)

    intended_ids = {s.id for s in intended.servers.values()}
    fleet_bases = {spec.api_base: key for key, spec in assessment.desired.items()}
    for deployment in sorted(observation.deployments, key=lambda d: d.id):
        if deployment.id in intended_ids:
            continue
        whose = owner(deployment, claim)
        if whose is Owner.NOT_FLEETLLM:
            drift.append(Drift(deployment.id, deployment.model_name, _drift_reason(deployment, fleet_bases)))
            continue
        if whose is Owner.OTHER_FLEET:  # another fleet on the same LiteLLM: not this fleet's drift
            continue
        if whose is Owner.UNCLAIMED:
            drift.append(Drift(deployment.id, deployment.model_name, "it " + _not_ours(deployment, claim) + ": "
                               "never touched; delete it in LiteLLM if it is this fleet's (a box removed before "
                               "fleet ids)"))
            continue
        reason = _orphan_reason(deployment, intended)
        probe = observation.orphan_probes.get(deployment.id)
        if (probe is not None and probe.status is ProbeStatus.OK
                and _replacement_coming(deployment.model_name, intended, judgements)):
            held.append(Held(ActionKind.DELETE, deployment.id, deployment.model_name,
                             f"{reason}; kept while it still serves and no other server of "
                             f"{deployment.model_name} does yet"))
            continue
        actions.append(Action(ActionKind.DELETE, deployment.id, deployment.model_name, reason, before=deployment))

    actions, blocked = _delete_valves(actions, held, intended, observation, errors)
    pending = pending or {}
    actions = [_with_retry(a, pending.get(a.id)) for a in actions]
    actions.sort(key=lambda a: (ORDER[a.kind], a.id))
    return Plan(intended.revision, observation.observed_at, tuple(actions), tuple(held), tuple(drift),
                tuple(blocked), errors, judgements, unrouted=unrouted, warnings=warnings, claim=claim)


def _not_ours(deployment: Deployment, claim: Claim) -> str:
    """Why a deployment is not this fleet's to write, in words."""
    whose = owner(deployment, claim)
    if whose is Owner.OTHER_FLEET:
        return f"belongs to fleet {recorded_fleet(deployment)!r} (model_info.{INFO_FLEET})"
    if whose is Owner.UNCLAIMED:
        return "carries fleetllm's marker without a fleet id, for a box this fleet does not hold"
    return "no managed_by marker"


def _assumed_warnings(intended: Intended, observation: Observation) -> tuple[str, ...]:
    """One warning per provider whose boxes are dialled at their listen ports for want of a key."""
    boxes: dict[Provider, set[str]] = {}
    for key, resolution in observation.resolutions.items():
        server = intended.servers.get(key)
        if resolution.assumed and server is not None:
            boxes.setdefault(server.provider, set()).add(server.box)
    return tuple(f"{provider} box(es) {', '.join(sorted(names))}: {assumed_mapping(provider)}"
                 for provider, names in sorted(boxes.items()))


def _delete_valves(actions: list[Action], held: list[Held], intended: Intended, observation: Observation,
                   errors: tuple[str, ...]) -> tuple[list[Action], list[str]]:
    deletes = [a for a in actions if a.kind is ActionKind.DELETE]
    if not deletes:
        return actions, []
    settings = intended.settings
    claim = claim_of(intended)
    managed = sum(1 for d in observation.deployments or () if writable(d, claim))
    budget = delete_budget(settings.max_deletes_per_pass, settings.max_delete_fraction, managed)
    why: str | None = None
    if errors:
        why = "no deletes while an observation failed (" + "; ".join(errors) + ")"
    elif not settings.prune:
        why = "prune is off (fleet.yaml reconcile.prune: false)"
    elif len(deletes) > budget:
        why = (f"{len(deletes)} deletes exceed this pass's limit of {budget} (max_deletes_per_pass="
               f"{settings.max_deletes_per_pass}, max_delete_fraction={settings.max_delete_fraction:g} of "
               f"{managed} managed deployments): nothing deleted; check the fleet, or raise the limits")
    if why is None:
        return actions, []
    held.extend(Held(a.kind, a.id, a.model_name, f"{a.reason} [held: {why}]") for a in deletes)
    return [a for a in actions if a.kind is not ActionKind.DELETE], [why]


def _with_retry(action: Action, pending: PendingDelete | None) -> Action:
    if pending is None or action.kind is not ActionKind.DELETE:
        return action
    return Action(action.kind, action.id, action.model_name,
                  f"{action.reason} (retry: {pending.attempts} failed attempt(s), last: {pending.last_error})",
                  before=action.before)


def _drift_reason(deployment: Deployment, fleet_bases: Mapping[str, ServerKey]) -> str:
    where = "config-file model" if not deployment.db_model else "unmanaged deployment"
    if deployment.db_model and deployment.model_info.get("self_hosted") is True:
        where = "llmao's deployment (self_hosted; `fleetllm apply --adopt llmao` takes it over)"
    key = fleet_bases.get((deployment.api_base or "").rstrip("/"))
    if key is not None:
        return f"{where} pointing at fleet server {key[0]}:{key[1]} (in LiteLLM, not in the repository)"
    return f"{where} (in LiteLLM, not in the repository): never touched"
