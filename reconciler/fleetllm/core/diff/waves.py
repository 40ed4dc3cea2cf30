"""The staged rollout a change will take (issue 14): its waves, for `fleetllm diff` and the PR comment."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

from fleetllm.core.diff.report import Alert, Level, Report
from fleetllm.core.diff.sections import Section
from fleetllm.core.fleet.jsonvalue import JSON
from fleetllm.core.fleet.model import Fleet, RolloutMode
from fleetllm.core.rollout.waves import BoxWave, Dark, OverBudget, Waves, plan_waves

TITLE = "Rollout (boot changes, box by box, for boxes running the box agent)"


def _box_line(wave: BoxWave, head: Fleet) -> str:
    parts = []
    if wave.restarts:
        parts.append("drains and restarts " + ", ".join(wave.restarts))
    if wave.stops:
        parts.append("drains and stops " + ", ".join(wave.stops))
    if wave.starts:
        parts.append("starts " + ", ".join(wave.starts))
    manual = " [rollout: manual: a person restarts it]" if head.box(wave.box) is not None \
        and head.rollout_mode(wave.box) is RolloutMode.MANUAL else ""
    return f"    {wave.box}: {'; '.join(parts)}{manual}"


def waves_lines(waves: Waves, head: Fleet) -> list[str]:
    lines = []
    for number in sorted({b.wave for b in waves.boxes}):
        lines.append(f"  wave {number}:" if number else "  at once (only adds servers):")
        lines.extend(_box_line(b, head) for b in waves.in_wave(number))
    for model, out in sorted(waves.short.items()):
        if out:
            lines.append(f"  {model}: at most {out} server(s) out at once (max_unavailable "
                         f"{head.max_unavailable(model)})")
    lines.extend(f"  not released: {box}: {why}" for box, why in sorted(waves.stuck.items()))
    return lines


def _dark_message(dark: Dark, head: Fleet) -> str:
    model, n, budget = dark.model, dark.servers, head.max_unavailable(dark.model)
    if len(dark.boxes) == 1:
        what = (f"box {dark.boxes[0]} takes out its only server" if n == 1 else
                f"box {dark.boxes[0]} holds all {n} of its servers and takes them out at once")
        todo = f"To keep it serving, place a replica of {model} on another box; or accept it"
    else:
        who = f"boxes {', '.join(dark.boxes)}" if dark.boxes else "the rollout"
        what = f"{who} take out all {n} of its servers at once"
        todo = (f"To keep it serving, set max_unavailable for {model} below {n} in models.yaml, or place a "
                "replica on another box; or accept it")
    return (f"rollout: model {model} has NO server for a while: {what} (max_unavailable {budget}), so requests "
            f"to {model} fail until they have loaded. {todo}")


def _over_message(over: OverBudget, head: Fleet) -> str:
    model = over.model
    how = (f"a person restarts it (rollout: manual): do so only when no other server of {model} is out"
           if head.box(over.box) is not None and head.rollout_mode(over.box) is RolloutMode.MANUAL else
           f"a box is released whole, so it goes alone (only when no other server of {model} is out)")
    return (f"rollout: box {over.box} takes out {over.out} of {model}'s {over.serving} servers at once, more than "
            f"its max_unavailable {over.budget}: {how}, and {model} serves from {over.serving - over.out} of "
            f"{over.serving} until they have loaded. To stay within the budget, spread {model}'s replicas across "
            f"boxes, or raise max_unavailable for {model} in models.yaml to {over.out}; or accept it")


def waves_alerts(waves: Waves, head: Fleet) -> Iterator[Alert]:
    """Warnings for the top of the report: a box that takes out more of a model's servers than its budget
    (a box is released whole), and a model left with no server while it restarts."""
    dark = {d.model: d for d in waves.dark}
    for over in waves.over:
        if over.model in dark and dark[over.model].boxes == (over.box,):
            continue  # said by the model's no-server warning
        yield Alert(Level.WARNING, "rollout-over-budget", _over_message(over, head), over.box)
    for d in waves.dark:
        yield Alert(Level.WARNING, "rollout-no-server", _dark_message(d, head), d.model)


def with_waves_alerts(alerts: tuple[Alert, ...], waves: Waves, head: Fleet) -> tuple[Alert, ...]:
    """The report's alerts with the rollout's warnings after its outages and warnings, before its notes."""
    at = max((i + 1 for i, a in enumerate(alerts) if a.level is not Level.NOTE), default=0)
    return (*alerts[:at], *waves_alerts(waves, head), *alerts[at:])


def with_waves(report: Report, waves: Waves, head: Fleet) -> Report:
    """The report as the rollout will play it, so that every section gives one figure per model: each model's
    restarts take out as many servers at once as the waves do, and the report's own guess for a model whose
    servers all change ("may have no healthy server ... unless the boxes restart one at a time") gives way
    to the waves' answer where the rollout releases the boxes (a make-before-break move keeps a server;
    a model the waves leave dark has the rollout's own warning). Boxes with `rollout: manual` keep the
    guess: a person restarts them, in whatever order."""
    manual = {row.model for box in head.boxes.values() if head.rollout_mode(box.name) is RolloutMode.MANUAL
              for row in box.servers}
    kept = tuple(a for a in report.alerts if a.code != "no-steady-server" or a.subject in manual)
    disruptions = tuple(replace(d, out_at_once=min(len(d.restarting), max(1, waves.short.get(d.model, 1))))
                        for d in report.disruptions)
    return replace(report, alerts=with_waves_alerts(kept, waves, head), disruptions=disruptions)


def waves_section(base: Fleet, head: Fleet, waves: Waves | None = None) -> Section | None:
    """None when no box has a boot change."""
    waves = plan_waves(base, head) if waves is None else waves
    if not waves.boxes and not waves.stuck:
        return None
    summary = f"{waves.waves} wave(s), {len(waves.boxes)} box(es)"
    return Section(TITLE, summary, tuple(waves_lines(waves, head)))


def waves_json(base: Fleet, head: Fleet, waves: Waves | None = None) -> JSON:
    waves = plan_waves(base, head) if waves is None else waves
    return {"waves": waves.waves,
            "boxes": [{"box": b.box, "wave": b.wave, "restarts": list(b.restarts), "starts": list(b.starts),
                       "stops": list(b.stops)}
                      for b in waves.boxes],
            "max_out": dict(waves.short), "not_released": dict(waves.stuck),
            "over_budget": [{"box": o.box, "model": o.model, "out": o.out, "serving": o.serving,
                             "max_unavailable": o.budget} for o in waves.over],
            "no_server": [{"model": d.model, "boxes": list(d.boxes), "servers": d.servers} for d in waves.dark]}
