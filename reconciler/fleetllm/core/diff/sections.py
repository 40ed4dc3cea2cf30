"""The report's detail sections as lines, shared by the text and Markdown renderings.

Each line starts with its sign in column 0 (`+` new, `-` gone, `~` changed, `-/+` replaced, space
for details), so the Markdown form can show them in a `diff` block. A later `fleetllm plan` can add
its own `Section` to a rendering.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from fleetllm.core.diff.fields import field_line
from fleetllm.core.diff.report import (
    ASSUMED_LOAD_S,
    BoxImpact,
    BoxStatus,
    DeploymentAction,
    FieldChange,
    Lifetime,
    Report,
    ServerAction,
    ServerChange,
    ServerRef,
)
from fleetllm.core.diff.summary import deployment_counts, plural

DETAIL = "      "
PAUSED = " (paused: not applied until resumed)"
TAGS = {Lifetime.BOOT: "boot", Lifetime.LIVE: "live", Lifetime.NONE: "no effect", Lifetime.BAKED: "baked"}


@dataclass(frozen=True)
class Section:
    title: str  # what the section is, with the lifetime that governs it
    summary: str  # a short count, for a collapsed Markdown section
    lines: tuple[str, ...]


def _fields(fields: Iterable[FieldChange], tagged: bool = False) -> list[str]:
    return [DETAIL + field_line(f) + (f" [{TAGS[f.lifetime]}]" if tagged else "") for f in fields]


def box_verdict(box: BoxImpact) -> str:
    """The box's one-line instruction: provision, restart (which servers), destroy."""
    if box.status is BoxStatus.NEW:
        starts = f"at first boot it starts {', '.join(box.start)}" if box.start else "it has no server yet"
        return f"box {box.name} is new: provision it; {starts}"
    if box.status is BoxStatus.REMOVED:
        return f"box {box.name} leaves the fleet: destroy the instance once its deployments are gone"
    if box.status is BoxStatus.CHANGED:
        return f"box {box.name}: details change, no restart"
    running = sorted({*box.start, *box.restart})
    gateway = any(f.path == ("gateway",) for f in box.details)
    if not running and not box.stop and gateway:
        return f"box {box.name} must re-fetch its config and restart its gateway"
    parts = [f"servers {', '.join(running)}"] if running else []
    parts += [f"stops {', '.join(box.stop)}"] if box.stop else []
    parts += ["its gateway"] if gateway else []
    return f"box {box.name} must re-fetch its config and restart vLLM ({'; '.join(parts)})"


def _label(ref: ServerRef) -> str:
    """`name`, or `name [model]` when the process name is not the model's."""
    return ref.name if ref.name == ref.model else f"{ref.name} [{ref.model}]"


def _server_lines(box: str, change: ServerChange) -> list[str]:
    before, after = change.before, change.after
    bearer = " (new bearer)" if change.bearer else ""
    if change.action is ServerAction.ADD and after:
        return [f"+   :{after.port} {_label(after)} added"]
    if change.action is ServerAction.REMOVE and before:
        return [f"-   :{before.port} {_label(before)} removed"]
    assert before is not None
    assert after is not None
    if change.action is ServerAction.MOVE and before.box != after.box:
        if box == before.box:
            return [f"-   :{before.port} {_label(before)} moves to {after.address}"]
        head = f"+   :{after.port} {_label(after)} moved from {before.address}{bearer}"
    elif change.action is ServerAction.MOVE:
        head = f"~   :{before.port} -> :{after.port} {_label(after)} moved{bearer}"
    else:
        head = f"~   :{after.port} {_label(after)} changed"
    lines = [head, *_fields(change.fields)]
    if change.bearer and change.action is ServerAction.CHANGE:
        lines += _fields([FieldChange(("bearer",), change.bearer.before, change.bearer.after, Lifetime.BOOT)])
    return lines


def boxes_section(report: Report) -> Section | None:
    if not report.boxes:
        return None
    by_box: dict[str, list[ServerChange]] = {}
    for change in report.servers:
        for box_name in sorted({r.box for r in (change.before, change.after) if r}):
            by_box.setdefault(box_name, []).append(change)
    lines = []
    sign = {BoxStatus.NEW: "+", BoxStatus.REMOVED: "-", BoxStatus.RESTART: "~", BoxStatus.CHANGED: "~"}
    for box in report.boxes:
        lines.append(f"{sign[box.status]} {box_verdict(box)}{PAUSED if box.paused else ''}")
        lines += _fields(box.details, tagged=True)
        for change in by_box.get(box.name, ()):
            lines += _server_lines(box.name, change)
        if box.redivided:
            lines.append(f"~   {', '.join(box.redivided)} {'restarts' if len(box.redivided) == 1 else 'restart'}: "
                         + ("unchanged, but the new set does not fit around the current shares of the card, so "
                            "the card is divided afresh" if box.card_known else
                            "unchanged, but the card's size is not known (no gpu_memory_gb in placement.yaml) and a "
                            "server that starts or changes on it may re-divide it: counted as restarting"))
    parts = [f"{len(found)} {label}" for status, label in ((BoxStatus.RESTART, "to restart"),
                                                           (BoxStatus.NEW, "new"), (BoxStatus.REMOVED, "removed"),
                                                           (BoxStatus.CHANGED, "details only"))
             if (found := report.boxes_with(status))]
    return Section("Boxes (boot lifetime: a box applies these when it re-fetches its config and restarts vLLM)",
                   "Boxes: " + ", ".join(parts), tuple(lines))


def deployments_section(report: Report) -> Section | None:
    if not report.deployments:
        return None
    lines = []
    for d in report.deployments:
        paused = PAUSED if d.paused else ""
        if d.action is DeploymentAction.CREATE and d.after:
            lines.append(f"+ {d.address} {d.after.model_name} will be created{paused}")
        elif d.action is DeploymentAction.DELETE and d.before:
            lines.append(f"- {d.address} {d.before.model_name} will be deleted{paused}")
        elif d.action is DeploymentAction.REPLACE and d.before and d.after:
            lines.append(f"-/+ {d.address} {d.before.model_name} -> {d.after.model_name} will be replaced{paused}")
        else:
            assert d.after is not None
            lines.append(f"~ {d.address} {d.after.model_name} will be updated{paused}")
            lines += _fields(d.fields)
    return Section("LiteLLM deployments (live lifetime: the reconciler applies these at its next pass)",
                   "LiteLLM deployments: " + deployment_counts(report), tuple(lines))


def bearers_section(report: Report) -> Section | None:
    if not report.bearers:
        return None
    lines = [f"~ {b.server.address} {b.server.name}: {b.before} -> {b.after}" for b in report.bearers]
    return Section("Bearers (a function of box and listen port; never printed)",
                   f"Bearers: {plural(len(lines), 'server')} {'gets' if len(lines) == 1 else 'get'} a new one",
                   tuple(lines))


def catalog_section(report: Report) -> Section | None:
    if not report.recipes and not report.settings:
        return None
    lines = []
    for recipe in report.recipes:
        placed = (f"on {plural(recipe.servers, 'server')}" if recipe.servers else "not placed")
        if recipe.action == "add":
            lines.append(f"+ model {recipe.model} added to the catalog ({placed})")
        elif recipe.action == "remove":
            lines.append(f"- model {recipe.model} removed from the catalog (was {placed})")
        else:
            lines.append(f"~ model {recipe.model} ({placed})")
            lines += _fields(recipe.fields, tagged=True)
    if report.settings:
        lines.append("~ fleet settings")
        lines += _fields(report.settings, tagged=True)
    return Section("Catalog and settings (models.yaml, fleet.yaml)",
                   f"Catalog and settings: {plural(len(report.recipes), 'model')}, "
                   f"{plural(len(report.settings), 'setting')}", tuple(lines))


def disruptions_section(report: Report) -> Section | None:
    if not report.disruptions:
        return None
    lines = []
    for d in report.disruptions:
        where = ", ".join(f"{r.address} {r.name}" for r in d.restarting)
        out = len(d.restarting)
        left = d.serving - max(1, d.out_at_once)
        if left <= 0:
            effect = f"it has no server for about {d.seconds} s"
        else:
            effect = f"it serves from {left} of {d.serving} servers for about {d.seconds} s"
        verb = "restarts" if out == 1 else "restart"
        lines.append(f"~ model {d.model}: {plural(out, 'server')} of {d.serving} {verb} ({where}); {effect}")
    return Section(f"Restarts (a restarted server is out while vLLM loads: {ASSUMED_LOAD_S} s assumed, as fleetllm "
                   "has no load-time setting; as many of a model's servers at once as its rollout takes out)",
                   f"Restarts: {plural(len(lines), 'model')} with fewer servers for a while", tuple(lines))


def sections(report: Report) -> list[Section]:
    found = (boxes_section(report), disruptions_section(report), deployments_section(report), bearers_section(report),
             catalog_section(report))
    return [s for s in found if s is not None]
