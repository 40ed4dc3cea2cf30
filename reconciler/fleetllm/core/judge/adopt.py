"""Adopting llmao's LiteLLM deployments: `fleetllm plan|apply --adopt llmao`. Pure.

llmao wrote its deployments with `/model/new`: LiteLLM chose their ids, they carry no ownership marker,
`model_info.self_hosted: true`, and the server's address twice, in `litellm_params.api_base`
(`http://HOST:PUBLIC_PORT/v1`, which LiteLLM may return encrypted) and in plain text in
`model_info.asf_api_base`. Left alone, every server would be routed twice once fleetllm creates its
own deployment, and a moved server would keep its stale llmao route.

For each such deployment, matched to a server by model name and normalised address (llmao's identity:
strip a trailing `/` and one `/v1`):
- a server fleetllm intends and that serves: its fleetllm deployment first (created in this pass or
  already there), then llmao's is deleted, and apply deletes it only after re-reading fleetllm's from
  LiteLLM (make-before-break: callers never see a gap);
- a server that does not serve yet (Pending, Loading, Down, Unknown...): llmao's deployment stays until
  fleetllm has one of its own for it;
- no server fleetllm intends: reported and left, unless `--prune-adopted` (then it is an ordinary
  delete, under the delete budget);
- a paused box or model: held; any observation failure: no adoption delete at all.
Commercial deployments (`self_hosted` not true) and rows of any other owner are never touched.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from fleetllm.core.judge.adoption import Adoption, AdoptSource, Fate
from fleetllm.core.judge.assess import Assessment
from fleetllm.core.judge.intended import Intended, ServerKey
from fleetllm.core.judge.observed import Deployment, Observation
from fleetllm.core.judge.ownership import writable
from fleetllm.core.judge.plan import ORDER, Action, ActionKind, Drift, Held, Plan, delete_budget
from fleetllm.core.judge.verdict import SERVING
from fleetllm_contract.addresses import normalise_host


def normalise_base(url: str | None) -> str | None:
    """llmao's identity of an address: no surrounding space, no trailing `/`, one `/v1` less, the host
    without ::ffff:, scheme and host lower-cased. None for anything that is not an http(s) URL (an
    encrypted value read back from LiteLLM)."""
    if not isinstance(url, str):
        return None
    text = url.strip().rstrip("/")
    if text.endswith("/v1"):
        text = text[:-3].rstrip("/")
    scheme, sep, rest = text.partition("://")
    if not sep or scheme.lower() not in ("http", "https"):
        return None
    authority, slash, path = rest.partition("/")
    host, colon, port = authority.rpartition(":") if not authority.endswith("]") else (authority, "", "")
    if not colon:
        host, port = authority, ""
    host = normalise_host(host.strip("[]")) if host.startswith("[") else normalise_host(host)
    host = f"[{host}]" if ":" in host else host
    return f"{scheme.lower()}://{host.lower()}{':' + port if port else ''}{slash}{path}"


def is_llmao(deployment: Deployment) -> bool:
    return (not deployment.managed and deployment.db_model
            and deployment.model_info.get("self_hosted") is True)


def _addresses(deployment: Deployment) -> set[str]:
    found = {normalise_base(deployment.api_base), normalise_base(deployment.info_str("asf_api_base"))}
    return {a for a in found if a is not None}


def _server_addresses(intended: Intended, observation: Observation) -> dict[tuple[str, str], ServerKey]:
    """(model, normalised address) -> server, from where this pass resolved each server."""
    out: dict[tuple[str, str], ServerKey] = {}
    for key, server in intended.servers.items():
        resolution = observation.resolutions.get(key)
        if resolution is None or resolution.endpoint is None:
            continue
        address = normalise_base(resolution.endpoint.url())
        if address is not None:
            out[(server.model, address)] = key
    return out


def adopt(plan: Plan, intended: Intended, observation: Observation, assessment: Assessment,
          source: AdoptSource = AdoptSource.LLMAO, *, prune_adopted: bool = False) -> Plan:
    """`plan` (from make_plan) with llmao's deployments adopted: their deletes added after the creates."""
    if observation.deployments is None:
        return plan
    listed = {d.id: d for d in observation.deployments}
    addresses = _server_addresses(intended, observation)
    planned_writes = {a.id for a in plan.actions if a.kind is not ActionKind.DELETE}
    planned_deletes = {a.id for a in plan.actions if a.kind is ActionKind.DELETE}
    actions = list(plan.actions)
    held = list(plan.held)
    adoptions: list[Adoption] = []
    prunes: list[Action] = []
    errors = plan.errors
    for deployment in sorted(observation.deployments, key=lambda d: (d.model_name, d.id)):
        if deployment.managed or not deployment.db_model:
            continue
        if not is_llmao(deployment):
            adoptions.append(Adoption(deployment.id, deployment.model_name, None, None, Fate.COMMERCIAL,
                                      "not self-hosted (model_info.self_hosted is not true): never touched"))
            continue
        found = _addresses(deployment)
        address = min(found) if found else None
        key = next((addresses[(deployment.model_name, a)] for a in sorted(found)
                    if (deployment.model_name, a) in addresses), None)
        if key is None:
            why = ("no server in the repository serves this model at this address" if found else
                   "neither litellm_params.api_base nor model_info.asf_api_base is a readable address")
            if errors and found:
                why += " (as far as this pass could observe: " + "; ".join(errors) + ")"
            if prune_adopted and found and not errors:
                prunes.append(Action(ActionKind.DELETE, deployment.id, deployment.model_name,
                                     f"llmao deployment for {address}: {why}; --prune-adopted", before=deployment,
                                     adopted=True))
                adoptions.append(Adoption(deployment.id, deployment.model_name, address, None, Fate.PRUNED, why))
            else:
                adoptions.append(Adoption(deployment.id, deployment.model_name, address, None, Fate.NOT_INTENDED,
                                          f"{why}: left as it is (--prune-adopted deletes it)"))
            continue
        server = intended.servers[key]
        judgement = plan.judgements.get(key)
        where = f"{key[0]}:{key[1]}"
        if server.paused:
            reason = "reconcile: paused (box or model): llmao's deployment stays"
            held.append(Held(ActionKind.DELETE, deployment.id, deployment.model_name, reason))
            adoptions.append(Adoption(deployment.id, deployment.model_name, address, key, Fate.HELD, reason,
                                      server.id))
            continue
        ours = listed.get(server.id)
        has_ours = ((ours is not None and writable(ours, plan.claim) and server.id not in planned_deletes)
                    or server.id in planned_writes)
        if judgement is None or judgement.verdict not in SERVING or not has_ours:
            verdict = judgement.verdict if judgement is not None else "not judged"
            reason = (f"{where} is {verdict}: llmao's deployment stays until fleetllm has its own for it"
                      if judgement is None or judgement.verdict not in SERVING else
                      f"{where} serves but fleetllm's deployment {server.id} is not planned this pass "
                      "(its public address is not known yet): llmao's deployment stays")
            adoptions.append(Adoption(deployment.id, deployment.model_name, address, key, Fate.WAITING, reason,
                                      server.id))
            continue
        if errors:
            reason = "no adoption delete while an observation failed (" + "; ".join(errors) + ")"
            held.append(Held(ActionKind.DELETE, deployment.id, deployment.model_name, reason))
            adoptions.append(Adoption(deployment.id, deployment.model_name, address, key, Fate.HELD, reason,
                                      server.id))
            continue
        step = "created first in this pass" if server.id in planned_writes else "already in LiteLLM"
        reason = (f"llmao deployment of {where}: replaced by fleetllm's {server.id} ({step}); deleted only once "
                  "that one is in LiteLLM")
        actions.append(Action(ActionKind.DELETE, deployment.id, deployment.model_name, reason, before=deployment,
                              adopted=True, requires=server.id))
        adoptions.append(Adoption(deployment.id, deployment.model_name, address, key, Fate.REPLACED, reason,
                                  server.id))
    blocked = list(plan.blocked)
    if prunes:
        managed = sum(1 for d in observation.deployments if d.managed or is_llmao(d))
        budget = delete_budget(intended.settings.max_deletes_per_pass, intended.settings.max_delete_fraction, managed)
        deletes = sum(1 for a in actions if a.kind is ActionKind.DELETE and a.requires is None) + len(prunes)
        valve: str | None = None
        if not intended.settings.prune:
            valve = "prune is off (fleet.yaml reconcile.prune: false)"
        elif deletes > budget:
            valve = (f"{deletes} deletes exceed this pass's limit of {budget}: no --prune-adopted delete; "
                     "raise the limits or prune over several passes")
        if valve is not None:
            blocked.append(valve)
            held.extend(Held(a.kind, a.id, a.model_name, f"{a.reason} [held: {valve}]") for a in prunes)
            adoptions = [dataclasses.replace(a, fate=Fate.HELD, reason=f"{a.reason} [held: {valve}]")
                         if a.fate is Fate.PRUNED else a for a in adoptions]
        else:
            actions.extend(prunes)
    adopted_ids = {a.id for a in adoptions if a.fate is not Fate.COMMERCIAL}
    drift: tuple[Drift, ...] = tuple(d for d in plan.drift if d.id not in adopted_ids)
    actions.sort(key=lambda a: (ORDER[a.kind], a.id))
    return dataclasses.replace(plan, actions=tuple(actions), held=tuple(held), drift=drift, blocked=tuple(blocked),
                               adoptions=tuple(adoptions), adopt_source=str(source))


def adoption_counts(adoptions: tuple[Adoption, ...]) -> Mapping[Fate, int]:
    counts: dict[Fate, int] = {}
    for a in adoptions:
        counts[a.fate] = counts.get(a.fate, 0) + 1
    return counts
