"""`diff_fleets(base, head) -> Report`: pure, over two valid fleets; needs no salt and no network."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict

from fleetllm.core.diff.fields import diff_fields
from fleetllm.core.diff.report import (
    ASSUMED_LOAD_S,
    Alert,
    AllowedOption,
    BoxImpact,
    BoxStatus,
    DeploymentAction,
    DeploymentChange,
    Disruption,
    Level,
    Lifetime,
    RecipeChange,
    Report,
    ServerChange,
    ServerRef,
)
from fleetllm.core.diff.routes import deployment_changes
from fleetllm.core.diff.servers import box_documents, process_plans, server_changes
from fleetllm.core.diff.summary import plural
from fleetllm.core.fleet.jsonvalue import JSON, thaw
from fleetllm.core.fleet.model import Box, Fleet, FleetSettings, Recipe, ReconcileMode
from fleetllm.core.fleet.options import RISKY_OPTIONS, risky_tokens
from fleetllm.core.fleet.render import vllm_args
from fleetllm_contract import division


def diff_fleets(base: Fleet, head: Fleet) -> Report:
    servers = server_changes(base, head)
    deployments = deployment_changes(base, head)
    boxes = box_impacts(base, head, servers)
    return Report(
        base=base.revision,
        head=head.revision,
        boxes=boxes,
        servers=servers,
        deployments=deployments,
        alerts=(*alerts(base, head, servers, deployments), *division_alerts(boxes)),
        recipes=recipe_changes(base, head),
        settings=diff_fields(settings_json(base.settings), settings_json(head.settings), _settings_lifetime),
        disruptions=disruptions(head, boxes),
        allowed=newly_allowed(base, head),
    )


def newly_allowed(base: Fleet, head: Fleet) -> tuple[AllowedOption, ...]:
    """Risky vLLM options a recipe allows at HEAD and did not at BASE (a new recipe: all it allows)."""
    found: list[AllowedOption] = []
    for name, recipe in sorted(head.recipes.items()):
        old = base.recipes.get(name)
        before = old.vllm.allow_options if old is not None else frozenset()
        used = {option for _, _, option in risky_tokens(vllm_args(recipe))}
        found.extend(AllowedOption(name, option, RISKY_OPTIONS.get(option, "not a known risky option"),
                                   option in used, placed_count(head, name))
                     for option in sorted(recipe.vllm.allow_options - before))
    return tuple(found)


def redivision(base: Fleet, head: Fleet) -> dict[str, division.BoxChange]:
    """Per box at both revisions: what applying HEAD's box JSON does to its processes, the card's division
    included (fleetllm_contract.division, the code the installer divides with)."""
    before, after = box_documents(base), box_documents(head)
    return {name: division.box_change(before[name], after[name], head.boxes[name].card_gb)
            for name in sorted(set(before) & set(after))}


def division_alerts(boxes: tuple[BoxImpact, ...]) -> Iterator[Alert]:
    for box in boxes:
        names, one = ", ".join(box.redivided), len(box.redivided) == 1
        if box.redivided and box.card_known:
            yield Alert(Level.WARNING, "card-redivided", f"box {box.name}: the servers that start or change on it "
                        f"do not fit around the running servers' shares of the card, so the card is divided afresh and "
                        f"{names} (unchanged) "
                        f"{'restarts' if one else 'restart'} too", box.name)
        elif box.redivided:
            yield Alert(Level.NOTE, "card-size-unknown", f"box {box.name} has no gpu_memory_gb in placement.yaml, so "
                        f"whether {names} {'keeps' if one else 'keep'} running is not known: counted as restarting",
                        box.name)


def disruptions(head: Fleet, boxes: tuple[BoxImpact, ...]) -> tuple[Disruption, ...]:
    """Models that serve from fewer servers while restarted servers load (one at a time)."""
    refs = {(box.name, row.name): ServerRef(box.name, row.port, row.name, row.model)
            for box in head.boxes.values() for row in box.servers}
    restarting: dict[str, list[ServerRef]] = {}
    for change in boxes:
        for name in change.restart:
            if (ref := refs.get((change.name, name))) is not None:
                restarting.setdefault(ref.model, []).append(ref)
    return tuple(Disruption(model, tuple(sorted(found)), placed_count(head, model), len(found) * ASSUMED_LOAD_S)
                 for model, found in sorted(restarting.items()))


def box_json(box: Box) -> dict[str, JSON]:
    details: dict[str, JSON] = {"provider": box.provider.value if box.provider else None,
                                "gpu_memory_gb": box.gpu_memory_gb, "gpus": box.gpus, "disk_gb": box.disk_gb,
                                "notes": box.notes, "reconcile": box.reconcile.value, "gateway": box.gateway_port,
                                "rollout": box.rollout.value if box.rollout else None}
    return {k: v for k, v in details.items() if v is not None}


def _box_lifetime(path: tuple[str, ...]) -> Lifetime:
    return {"reconcile": Lifetime.LIVE, "gateway": Lifetime.BOOT, "rollout": Lifetime.LIVE}.get(path[0], Lifetime.NONE)


def box_impacts(base: Fleet, head: Fleet, servers: tuple[ServerChange, ...]) -> tuple[BoxImpact, ...]:
    plans = process_plans(servers)
    divided = redivision(base, head)
    changes = []
    for name in sorted(set(base.boxes) | set(head.boxes)):
        old, new = base.box(name), head.box(name)
        plan = plans.get(name)
        start, restart, stop = ((tuple(sorted(plan.start)), tuple(sorted(plan.restart)), tuple(sorted(plan.stop)))
                                if plan else ((), (), ()))
        redivided: tuple[str, ...] = ()
        if (effect := divided.get(name)) is not None:
            redivided = tuple(sorted(effect.restarted - set(restart) - set(start) - set(stop)))
            restart = tuple(sorted({*restart, *redivided}))  # only beside a server change here: `plan` is set
        details = diff_fields(box_json(old) if old else {}, box_json(new) if new else {}, _box_lifetime)
        if old is None:
            assert new is not None
            status = BoxStatus.NEW
        elif new is None:
            status = BoxStatus.REMOVED
        elif plan is not None or any(d.lifetime is Lifetime.BOOT for d in details):
            status = BoxStatus.RESTART  # a gateway added, removed or moved restarts the box without any server change
        else:
            status = BoxStatus.CHANGED
        if status is BoxStatus.CHANGED and not details:
            continue
        if status in (BoxStatus.NEW, BoxStatus.REMOVED):
            details = ()  # the whole box is new or gone; its details are not news
        box = new if new is not None else old
        assert box is not None
        changes.append(BoxImpact(name, status, start, restart, stop, details,
                                 box.reconcile is ReconcileMode.PAUSED, redivided,
                                 effect.card_known if effect is not None else True))
    return tuple(changes)


def recipe_json(recipe: Recipe) -> dict[str, JSON]:
    vllm = recipe.vllm
    boot: dict[str, JSON] = {"model": vllm.model, "served_model_name": vllm.served_model_name,
                             "args": list(vllm.args), "settings": thaw(vllm.settings)}
    if vllm.allow_options:
        boot["allow_options"] = list[JSON](sorted(vllm.allow_options))
    for name in ("max_model_len", "gpu_memory_utilization", "vram_gb", "disk_gb", "kv_bytes_per_token"):
        if (value := getattr(vllm, name)) is not None:
            boot[name] = value
    out: dict[str, JSON] = {"vllm": boot, "reconcile": recipe.reconcile.value,
                            "litellm": {"params": thaw(recipe.litellm.params),
                                        "model_info": thaw(recipe.litellm.model_info)}}
    if recipe.health_grace_s is not None:
        out["health_grace_s"] = recipe.health_grace_s
    if recipe.max_unavailable is not None:
        out["max_unavailable"] = recipe.max_unavailable
    if recipe.description is not None:
        out["description"] = recipe.description
    return out


def _recipe_lifetime(path: tuple[str, ...]) -> Lifetime:
    if path[:2] == ("vllm", "allow_options"):
        return Lifetime.NONE  # validation only: the box JSON does not carry it
    return {"vllm": Lifetime.BOOT, "description": Lifetime.NONE}.get(path[0], Lifetime.LIVE)


def placed_count(fleet: Fleet, model: str) -> int:
    return sum(1 for box in fleet.boxes.values() for row in box.servers if row.model == model)


def recipe_changes(base: Fleet, head: Fleet) -> tuple[RecipeChange, ...]:
    changes = []
    for name in sorted(set(base.recipes) | set(head.recipes)):
        old, new = base.recipes.get(name), head.recipes.get(name)
        if new is None:
            changes.append(RecipeChange(name, "remove", (), placed_count(base, name)))
        elif old is None:
            changes.append(RecipeChange(name, "add", (), placed_count(head, name)))
        elif fields := diff_fields(recipe_json(old), recipe_json(new), _recipe_lifetime):
            changes.append(RecipeChange(name, "change", fields, placed_count(head, name)))
    return tuple(changes)


def settings_json(settings: FleetSettings) -> dict[str, JSON]:
    return {"fleet_id": settings.fleet_id,
            "listen_ports": list(settings.listen_ports), "max_servers_per_box": settings.max_servers_per_box,
            "allow_empty_placement": settings.allow_empty_placement,
            "legacy_servers": [f"{h}:{p}" for h, p in sorted(settings.legacy_servers)],
            "reconcile": dict(asdict(settings.reconcile)),
            "rollout": {**asdict(settings.rollout), "mode": settings.rollout.mode.value}}


def _settings_lifetime(path: tuple[str, ...]) -> Lifetime:
    return {"legacy_servers": Lifetime.BOOT, "reconcile": Lifetime.LIVE, "rollout": Lifetime.LIVE}.get(
        path[0], Lifetime.NONE)


def served_models(fleet: Fleet) -> dict[str, list[str]]:
    """Model name -> the addresses serving it."""
    served: dict[str, list[str]] = {}
    for box in fleet.boxes.values():
        for row in box.servers:
            served.setdefault(row.model, []).append(f"{box.name}:{row.port}")
    return served


def alerts(base: Fleet, head: Fleet, servers: tuple[ServerChange, ...],
           deployments: tuple[DeploymentChange, ...]) -> Iterator[Alert]:
    before, after = served_models(base), served_models(head)
    for model in sorted(set(before) - set(after)):
        where = ", ".join(sorted(before[model]))
        yield Alert(Level.OUTAGE, "last-server", f"model {model} loses its last server ({where}): LiteLLM stops "
                    "routing it at the next reconcile and its callers get errors", model)
    touched = {t for s in servers for t in s.touches()}
    for model in sorted(set(before) & set(after)):
        mine = [(box.name, row.name) for box in head.boxes.values() for row in box.servers if row.model == model]
        if all(server in touched for server in mine):
            yield Alert(Level.WARNING, "no-steady-server", f"model {model}: none of its servers stays as it is "
                        f"(each moves, restarts or is new): {model} may have no healthy server until they have "
                        "loaded, unless the boxes restart one at a time", model)
    for name in sorted(set(base.boxes) - set(head.boxes)):
        yield Alert(Level.WARNING, "box-removed", f"box {name} leaves the fleet: its deployments are deleted at "
                    "the next reconcile, and the instance keeps running (and billing) until you destroy it", name)
    yield from _prune_alerts(head.settings, deployments, base.server_count)
    was, now = base.settings.fleet_id, head.settings.fleet_id
    if was is not None and now != was:
        yield Alert(Level.WARNING, "fleet-id-changed", f"fleet.yaml fleet_id changes from {was} to {now or 'none'}: "
                    f"the fleet no longer owns the LiteLLM deployments written as {was} (never updated or deleted "
                    "again, and its servers' new deployments collide with their ids); keep the id", "fleet_id")
    for box in sorted(set(base.boxes) & set(head.boxes)):
        if head.boxes[box].reconcile is ReconcileMode.PAUSED and any(d.box == box for d in deployments):
            yield Alert(Level.NOTE, "box-paused", f"box {box} is paused: the reconciler applies none of its "
                        "LiteLLM changes until `reconcile: paused` is removed", box)
    for model in sorted(set(base.recipes) & set(head.recipes)):
        recipe = head.recipes[model]
        if recipe.reconcile is ReconcileMode.PAUSED and any(
                model in {r.model_name for r in (d.before, d.after) if r} for d in deployments):
            yield Alert(Level.NOTE, "model-paused", f"model {model} is paused: the reconciler applies none of "
                        "its LiteLLM changes until `reconcile: paused` is removed", model)


def _prune_alerts(settings: FleetSettings, deployments: tuple[DeploymentChange, ...],
                  existing: int) -> Iterator[Alert]:
    deletes = sum(1 for d in deployments if d.action in (DeploymentAction.DELETE, DeploymentAction.REPLACE))
    if not deletes:
        return
    knobs = settings.reconcile
    if not knobs.prune:
        yield Alert(Level.WARNING, "prune-off", f"{plural(deletes, 'LiteLLM deployment')} to delete, but prune is off "
                    "in fleet.yaml: they stay in LiteLLM until deleted by hand", "reconcile.prune")
    if deletes > knobs.max_deletes_per_pass:
        yield Alert(Level.WARNING, "delete-budget", f"{deletes} LiteLLM deployments to delete: more than one "
                    f"reconcile pass deletes (max_deletes_per_pass: {knobs.max_deletes_per_pass})",
                    "reconcile.max_deletes_per_pass")
    if existing and deletes / existing > knobs.max_delete_fraction:
        yield Alert(Level.WARNING, "delete-fraction", f"{deletes} of {existing} LiteLLM deployments to delete "
                    f"({deletes / existing:.0%}): above max_delete_fraction ({knobs.max_delete_fraction:.0%})",
                    "reconcile.max_delete_fraction")
