"""Plan output: Terraform-style text, or JSON (`format_version` 1.x: additive changes only).

Never prints a bearer: `api_key` is dropped from every litellm_params shown.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from fleetllm.core.cost import BoxPrice, prices_json
from fleetllm.core.fleet.jsonvalue import JSON, thaw
from fleetllm.core.judge.intended import Intended
from fleetllm.core.judge.plan import Action, ActionKind, Plan
from fleetllm.core.judge.verdict import SERVING, Availability, rollups

FORMAT_VERSION = "1.2"  # 1.1: "adoption" (plan --adopt); listed, litellm_error, warnings; per model routed and unrouted
# 1.2: "prices" (the boxes the listings priced: fleetllm.core.cost), "capacity" (fleetllm.core.capacity)
SYMBOL = {ActionKind.CREATE: "+", ActionKind.UPDATE: "~", ActionKind.REPLACE: "-/+", ActionKind.DELETE: "-"}
WHAT = {ActionKind.CREATE: "will be created", ActionKind.UPDATE: "will be updated in-place",
        ActionKind.REPLACE: "must be replaced", ActionKind.DELETE: "will be destroyed"}
JSON_ACTIONS = {ActionKind.CREATE: ["create"], ActionKind.UPDATE: ["update"],
                ActionKind.REPLACE: ["delete", "create"], ActionKind.DELETE: ["delete"]}


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def summary_line(plan: Plan) -> str:
    if not plan.listed:
        return "Plan: none (LiteLLM's deployments are not known; nothing would be written)."
    add, change, destroy = plan.summary
    return f"Plan: {add} to add, {change} to change, {destroy} to destroy."


@dataclass(frozen=True)
class ModelRouting:
    """A model as callers see it: available only when a deployment routes to a serving server."""

    availability: Availability
    routed: int  # serving servers a deployment in LiteLLM routes to
    serving: int
    total: int
    unrouted: tuple[str, ...]  # "box:port: why no deployment routes to it"


def model_routing(plan: Plan, intended: Intended) -> dict[str, ModelRouting]:
    out: dict[str, ModelRouting] = {}
    for model, rolled in rollups(intended.servers.values(), plan.judgements, "model").items():
        servers = [s for s in intended.by_model(model) if s.key in plan.judgements]
        serving = [s for s in servers if plan.judgements[s.key].verdict in SERVING]
        unrouted = tuple(f"{s.box}:{s.port}: {plan.unrouted[s.key]}" for s in serving if s.key in plan.unrouted)
        routed = len(serving) - len(unrouted)
        availability = (Availability.UNAVAILABLE if routed == 0 else
                        Availability.AVAILABLE if routed == rolled.total else Availability.DEGRADED)
        out[model] = ModelRouting(availability, routed, rolled.serving, rolled.total, unrouted)
    return out


def render_text(plan: Plan, intended: Intended, *, verbose: bool = True) -> str:
    lines = [f"fleetllm plan: revision {plan.revision[:12]}, observed {iso(plan.observed_at)}", ""]
    if verbose and intended.servers:
        lines.append("Servers:")
        width = max(len(f"{box}:{port}") for box, port in intended.servers)
        for key, server in sorted(intended.servers.items()):
            j = plan.judgements.get(key)
            if j is not None:
                lines.append(f"  {server.box + ':' + str(server.port):<{width}}  {server.model:<20} "
                             f"{j.verdict:<8} {j.reason}")
        if plan.listed:
            routing = model_routing(plan, intended)
            lines.append("Models (available: a deployment in LiteLLM routes to a serving server): " + ", ".join(
                f"{m} {r.availability} ({r.routed}/{r.total} routed)" for m, r in routing.items()))
            lines.extend(f"  ! {m} {why}" for m, r in routing.items() for why in r.unrouted)
        else:
            models = rollups(intended.servers.values(), plan.judgements, "model")
            lines.append("Models (serving by verdict; whether LiteLLM routes to them is unknown): " + ", ".join(
                f"{m} {r.serving}/{r.total} serving" for m, r in models.items()))
        lines.append("")
    if plan.warnings:
        lines.append("Warnings:")
        lines.extend(f"  ! {w}" for w in plan.warnings)
        lines.append("")
    if plan.errors:
        lines.append("Observation errors:")
        lines.extend(f"  ! {e}" for e in plan.errors)
        lines.append("")
    if plan.drift:
        lines.append("Drift (in LiteLLM, not managed by fleetllm; never touched):")
        lines.extend(f"  ? {d.id}  {d.model_name}  {d.reason}" for d in plan.drift)
        lines.append("")
    if plan.adopt_source is not None:
        lines.extend(_adoption_lines(plan))
    if not plan.listed:
        lines.append(f"No plan: LiteLLM's deployments are not known ({plan.litellm_error}). The verdicts above are "
                     "this pass's own; what LiteLLM routes, and what `fleetllm apply` would change in it, cannot "
                     "be shown, and nothing would be written.")
        lines.append("")
    elif plan.actions:
        lines.append("fleetllm will perform the following actions:")
        lines.append("")
        for action in plan.actions:
            lines.extend(_action_lines(action))
        lines.append("")
    elif any(not why.startswith("no deployment yet") for why in plan.unrouted.values()):
        lines.append("No changes fleetllm can make, but some serving servers have no deployment that routes to "
                     "them (see Models above).")
        lines.append("")
    else:
        lines.append("No changes. LiteLLM has a deployment exactly for the servers that serve.")
        lines.append("")
    if plan.held:
        lines.append("Held back this pass:")
        lines.extend(f"  {SYMBOL[h.kind]} {h.id}  {h.model_name}  {h.reason}" for h in plan.held)
        lines.append("")
    if plan.blocked:
        lines.extend(f"Deletes blocked: {b}" for b in plan.blocked)
        lines.append("")
    lines.append(summary_line(plan))
    return "\n".join(lines)


ADOPT_SYMBOL = {"replaced": "-", "pruned": "-", "waiting": "=", "held": "!", "not-intended": "?",
                "commercial": " "}


def _adoption_lines(plan: Plan) -> list[str]:
    lines = [f"Adoption of {plan.adopt_source}'s deployments ({len(plan.adoptions)} not managed by fleetllm):"]
    if not plan.adoptions:
        lines.append(f"  none: LiteLLM has no deployment of {plan.adopt_source}'s")
    for a in plan.adoptions:
        where = f" -> {a.address}" if a.address else ""
        lines.append(f"  {ADOPT_SYMBOL[str(a.fate)]} {a.id}  {a.model_name}{where}  {a.fate}: {a.reason}")
    lines.append("")
    return lines


def _action_lines(action: Action) -> list[str]:
    out = [f"  {SYMBOL[action.kind]} deployment {action.id}  {action.model_name}  {WHAT[action.kind]}"]
    if action.changes:
        out.extend(f"      ~ {change}" for change in action.changes)
    else:
        out.append(f"      # {action.reason}")
    return out


def _spec_view(action: Action) -> JSON:
    if action.after is None:
        return None
    params = {k: v for k, v in action.after.litellm_params.items() if k != "api_key"}
    return {"model_name": action.after.model_name, "litellm_params": thaw(params),
            "model_info": thaw(action.after.model_info)}


def _before_view(action: Action) -> JSON:
    before = action.before
    if before is None:
        return None
    return {"model_name": before.model_name, "api_base": before.recorded_api_base, "spec": before.spec,
            "managed": before.managed}


def plan_document(plan: Plan, intended: Intended, prices: Mapping[str, BoxPrice] | None = None,
                  capacity: JSON = None) -> dict[str, JSON]:
    """`prices`: the boxes the pass's listings priced, kept as `prices` (what `fleetllm diff --prices` and
    `fleetllm show --prices` read: the cost a pull request changes). `capacity`: the capacity plan beside the
    pass's (fleetllm.core.capacity.CapacityPlan.as_json), when fleet.yaml declares capacity."""
    add, change, destroy = plan.summary
    servers: list[JSON] = []
    for key, server in sorted(intended.servers.items()):
        j = plan.judgements.get(key)
        if j is not None:
            servers.append({"box": server.box, "port": server.port, "name": server.name, "model": server.model,
                            "id": server.id, "verdict": str(j.verdict), "reason": j.reason,
                            "paused": server.paused})
    def rolled(by: str) -> JSON:
        return {name: {"availability": str(r.availability), "serving": r.serving, "total": r.total}
                for name, r in rollups(intended.servers.values(), plan.judgements, by).items()}

    models = rolled("model")
    if plan.listed and isinstance(models, dict):
        for name, routing in model_routing(plan, intended).items():
            entry = models[name]
            if isinstance(entry, dict):
                entry["routed"] = routing.routed
                entry["unrouted"] = list[JSON](routing.unrouted)
    return {
        "format_version": FORMAT_VERSION,
        "revision": plan.revision,
        "observed_at": iso(plan.observed_at),
        "summary": {"add": add, "change": change, "destroy": destroy},
        "actions": [{"action": str(a.kind), "actions": list[JSON](JSON_ACTIONS[a.kind]), "id": a.id,
                     "model_name": a.model_name, "reason": a.reason, "changes": list[JSON](a.changes),
                     "before": _before_view(a), "after": _spec_view(a)} for a in plan.actions],
        "held": [{"action": str(h.kind), "id": h.id, "model_name": h.model_name, "reason": h.reason}
                 for h in plan.held],
        "drift": [{"id": d.id, "model_name": d.model_name, "reason": d.reason} for d in plan.drift],
        "blocked": list[JSON](plan.blocked),
        "adoption": None if plan.adopt_source is None else {
            "source": plan.adopt_source,
            "deployments": [{"id": a.id, "model_name": a.model_name, "address": a.address,
                             "server": None if a.server is None else {"box": a.server[0], "port": a.server[1]},
                             "fate": str(a.fate), "reason": a.reason, "replacement": a.replacement}
                            for a in plan.adoptions]},
        "errors": list[JSON](plan.errors),
        "listed": plan.listed,
        "litellm_error": plan.litellm_error,
        "warnings": list[JSON](plan.warnings),
        "servers": servers,
        "models": models,
        "boxes": rolled("box"),
        **({"prices": prices_json(prices)} if prices is not None else {}),
        **({"capacity": capacity} if capacity is not None else {}),
    }


def render_json(plan: Plan, intended: Intended, prices: Mapping[str, BoxPrice] | None = None,
                capacity: JSON = None) -> str:
    return json.dumps(plan_document(plan, intended, prices, capacity), indent=2, sort_keys=False)
