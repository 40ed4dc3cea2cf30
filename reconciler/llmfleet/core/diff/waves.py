"""The staged rollout a change will take (issue 14): its waves, for `llmfleet diff` and the PR comment."""

from __future__ import annotations

from llmfleet.core.diff.sections import Section
from llmfleet.core.fleet.jsonvalue import JSON
from llmfleet.core.fleet.model import Fleet, RolloutMode
from llmfleet.core.rollout.waves import BoxWave, Waves, plan_waves

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


def waves_section(base: Fleet, head: Fleet) -> Section | None:
    """None when no box has a boot change."""
    waves = plan_waves(base, head)
    if not waves.boxes and not waves.stuck:
        return None
    summary = f"{waves.waves} wave(s), {len(waves.boxes)} box(es)"
    return Section(TITLE, summary, tuple(waves_lines(waves, head)))


def waves_json(base: Fleet, head: Fleet) -> JSON:
    waves = plan_waves(base, head)
    return {"waves": waves.waves,
            "boxes": [{"box": b.box, "wave": b.wave, "restarts": list(b.restarts), "starts": list(b.starts),
                       "stops": list(b.stops)}
                      for b in waves.boxes],
            "max_out": dict(waves.short), "not_released": dict(waves.stuck)}
