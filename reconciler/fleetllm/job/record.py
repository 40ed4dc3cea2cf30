"""The record of one pass, built from what it saw, judged and did. Pure.

Besides the summary (verdict counts, actions, errors), the record keeps, per intended server, the
verdict and its reason, the public endpoint, max_model_len intended and served, and whether a managed
deployment exists; and the LiteLLM drift: unmanaged deployments (with the fleet server they point at,
if any) and duplicates (one model name at one address more than once, not all of them ours).
"""

from __future__ import annotations

from collections import Counter, defaultdict

from fleetllm.adapters.state.passes import (
    ActionRecord,
    CostRecord,
    DriftRecord,
    DuplicateRecord,
    PassMode,
    PassRecord,
    ServerRecord,
)
from fleetllm.core.cost import fleet_cost
from fleetllm.core.fleet.model import Fleet
from fleetllm.core.judge.intended import Intended
from fleetllm.core.judge.observed import Deployment, Observation, listing_prices
from fleetllm.core.judge.ownership import writable
from fleetllm.core.judge.plan import Plan
from fleetllm.job.apply import ActionOutcome, ActionResult


def _base(api_base: str | None) -> str:
    return (api_base or "").rstrip("/")


def server_records(intended: Intended, observation: Observation, plan: Plan) -> tuple[ServerRecord, ...]:
    managed = (None if observation.deployments is None
               else {d.id for d in observation.deployments if writable(d, plan.claim)})  # this fleet's own
    records = []
    for key, server in sorted(intended.servers.items()):
        judgement = plan.judgements.get(key)
        if judgement is None:
            continue
        resolution = observation.resolutions.get(key)
        probe = observation.probes.get(key)
        endpoint = resolution.endpoint if resolution is not None else None
        records.append(ServerRecord(
            box=server.box, port=server.port, name=server.name, model=server.model,
            verdict=str(judgement.verdict), reason=judgement.reason,
            endpoint=str(endpoint) if endpoint is not None else None, max_model_len=server.max_model_len,
            served_max_model_len=probe.max_model_len if probe is not None else None,
            deployment=None if managed is None else server.id in managed, paused=server.paused))
    return tuple(records)


def drift_records(intended: Intended, observation: Observation, plan: Plan) -> tuple[DriftRecord, ...]:
    listed = {d.id: d for d in observation.deployments or ()}
    fleet_bases: dict[str, str] = {}
    for (box, port), resolution in sorted(observation.resolutions.items()):
        if resolution.endpoint is not None and (box, port) in intended.servers:
            fleet_bases.setdefault(resolution.endpoint.url("/v1"), f"{box}:{port}")
    records = []
    for drift in plan.drift:
        deployment = listed.get(drift.id)
        api_base = deployment.api_base if deployment is not None else None
        records.append(DriftRecord(drift.id, drift.model_name, drift.reason, api_base,
                                   fleet_bases.get(_base(api_base))))
    return tuple(records)


def duplicate_records(deployments: tuple[Deployment, ...] | None) -> tuple[DuplicateRecord, ...]:
    groups: dict[tuple[str, str], list[Deployment]] = defaultdict(list)
    for deployment in deployments or ():
        if deployment.api_base:
            groups[(_base(deployment.api_base), deployment.model_name)].append(deployment)
    return tuple(DuplicateRecord(base, model, tuple(sorted(d.id for d in group)))
                 for (base, model), group in sorted(groups.items())
                 if len(group) > 1 and not all(d.managed for d in group))


def cost_record(fleet: Fleet, observation: Observation) -> CostRecord | None:
    """The fleet's cost from the pass's listings; None when no box of it is rented (nothing to price)."""
    cost = fleet_cost(fleet, listing_prices(observation.listings))
    if not cost.boxes and not cost.unpriced:
        return None
    return CostRecord(round(cost.total, 4), {b: round(p.per_hour, 4) for b, p in cost.boxes.items()},
                      {m: round(v, 4) for m, v in cost.models.items()}, cost.unpriced,
                      {b: p.what() for b, p in cost.boxes.items()})


def pass_record(started_at: float, duration_s: float, *, apply: bool, intended: Intended, observation: Observation,
                plan: Plan, results: tuple[ActionResult, ...], suspended: bool = False) -> PassRecord:
    """`suspended`: the pass did not write because the fleet was suspended (mode "suspended", not a dry run's
    "plan")."""
    return PassRecord(
        started_at=started_at, duration_s=duration_s, revision=intended.revision,
        mode=PassMode.of(apply=apply, suspended=suspended).value,
        verdicts=dict(Counter(str(j.verdict) for j in plan.judgements.values())),
        actions=(tuple(ActionRecord(str(r.action.kind), r.action.id, r.ok, r.outcome, r.error) for r in results)
                 if apply else
                 tuple(ActionRecord(str(a.kind), a.id, True, ActionOutcome.PLANNED) for a in plan.actions)),
        errors=plan.errors, blocked=plan.blocked, held=len(plan.held), drift=len(plan.drift),
        servers=server_records(intended, observation, plan),
        drift_details=drift_records(intended, observation, plan),
        duplicates=duplicate_records(observation.deployments))
