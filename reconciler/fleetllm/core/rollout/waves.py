"""The waves a change will take: the real step function driven over an idealised fleet (every box runs
the agent, every released server becomes Healthy and routed at the next pass), for `fleetllm diff` and
the pull-request comment. Pure; needs no salt (bearers come from a placeholder: only whether a digest
changes matters, and that does not depend on the salt)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from fleetllm.core.fleet.bearer import Salt
from fleetllm.core.fleet.model import Fleet
from fleetllm.core.fleet.render import Bearers
from fleetllm.core.rollout.change import box_change, disrupted_servers, over_budget
from fleetllm.core.rollout.configs import box_config
from fleetllm.core.rollout.model import (
    BoxConfig,
    BoxInput,
    BoxRelease,
    BoxState,
    ReportFacts,
    Rollout,
    RolloutState,
    ServerKey,
    StepInput,
)
from fleetllm.core.rollout.step import step

PLACEHOLDER = Bearers(Salt("fleetllm-waves-placeholder-salt"), legacy_key="fleetllm-waves-placeholder-legacy")


@dataclass(frozen=True)
class BoxWave:
    box: str
    wave: int  # 0: released at once (no boot change)
    restarts: tuple[str, ...]  # servers restarted (drained first)
    starts: tuple[str, ...]  # servers added
    stops: tuple[str, ...] = ()  # servers removed (drained first)


@dataclass(frozen=True)
class OverBudget:
    """A box whose release takes out more of a model's servers than the model's max_unavailable: a box is
    the smallest unit of release, so it goes alone (when no other server of the model is out)."""

    box: str
    model: str
    out: int  # the model's servers the box's release takes out at once
    serving: int  # the model's servers serving just before (the box's own included)
    budget: int


@dataclass(frozen=True)
class Dark:
    """A model left with no serving server for a while: every server it has is out at once."""

    model: str
    boxes: tuple[str, ...]  # the boxes whose release took them out
    servers: int  # how many it had serving just before


@dataclass(frozen=True)
class Waves:
    boxes: tuple[BoxWave, ...]  # boxes whose config changes, in release order
    waves: int
    stuck: Mapping[str, str]  # boxes the rollout would not release, and why
    short: Mapping[str, int]  # per model: the most of its servers out at once (drained or restarting)
    over: tuple[OverBudget, ...] = ()  # in release order
    dark: tuple[Dark, ...] = ()  # by model

    def in_wave(self, wave: int) -> tuple[BoxWave, ...]:
        return tuple(b for b in self.boxes if b.wave == wave)


BASE, HEAD = "base", "head"


def _id(box: str, port: int) -> str:
    return f"{box}:{port}"


def _config(fleet: Fleet, box: str, label: str) -> BoxConfig | None:
    config = box_config(fleet, box, PLACEHOLDER, _id)
    return None if config is None else replace(config, revision=label)


def plan_waves(base: Fleet, head: Fleet, max_passes: int | None = None) -> Waves:
    """Release order of `head` over `base`, with the head's budgets and drain time."""
    boxes = sorted(set(base.boxes) | set(head.boxes))
    old = {b: _config(base, b, BASE) for b in boxes}
    new = {b: _config(head, b, HEAD) for b in boxes}
    # The simulation names the two sides itself: the fleets' own revisions may be equal (a working tree).
    configs: dict[str, dict[str, BoxConfig | None]] = {BASE: old, HEAD: new}

    def at(label: str, box: str) -> BoxConfig | None:
        return configs.get(label, {}).get(box)

    # A box new at HEAD has no release yet: the step gives it one (and the target at once: it only starts).
    releases = {b: BoxRelease(b, BASE, BASE, 0.0, BoxState.APPLIED) for b in boxes if old[b] is not None}
    served = {b: BASE if old[b] is not None else "" for b in boxes}
    rollout: Rollout | None = None
    now, step_s = 0.0, float(head.settings.rollout.drain_s + 1)
    order: dict[str, int] = {}
    short: dict[str, int] = {}
    last_why: dict[str, str] = {}
    routed = {s.deployment for c in old.values() if c is not None for s in c.servers}
    cards = {b: placed.card_gb for b in boxes if (placed := head.boxes.get(b) or base.boxes.get(b)) is not None}
    over: list[OverBudget] = []
    dark: dict[str, Dark] = {}
    begun: set[str] = set()
    kept = {s.model for c in old.values() if c is not None for s in c.servers} & set(head.recipes) & {
        s.model for c in new.values() if c is not None for s in c.servers}

    def serving() -> dict[str, int]:
        """Per model, its servers that LiteLLM routes (of what each box is served)."""
        found: dict[str, int] = {}
        for b in boxes:
            config = at(served[b], b)
            for s in config.servers if config is not None else ():
                if s.deployment in routed:
                    found[s.model] = found.get(s.model, 0) + 1
        return found

    for _ in range(max_passes or 4 * len(boxes) + 20):
        before = serving()
        verdicts: dict[ServerKey, str] = {}
        for b in boxes:
            config = at(served[b], b)
            for s in config.servers if config is not None else ():
                verdicts[(b, s.port)] = "Healthy"
        inputs = {b: BoxInput(b, True, new[b], at(releases[b].revision, b) if b in releases else None,
                              at(releases[b].last_good, b) if b in releases else None,
                              ReportFacts(served[b], reported_at=now) if served[b] else None,
                              card_gb=cards.get(b)) for b in boxes}
        result = step(StepInput(HEAD, now, inputs, releases, rollout, verdicts, frozenset(routed),
                                {m: head.max_unavailable(m) for m in head.recipes}, head.settings.rollout.drain_s))
        rollout, releases = result.rollout, dict(result.releases)
        for model, keys in result.out.items():
            short[model] = max(short.get(model, 0), len(keys))
        for b, release in sorted(result.releases.items()):
            if b in begun or release.state not in (BoxState.DRAINING, BoxState.RELEASED):
                continue
            begun.add(b)
            out = over_budget(disrupted_servers(old[b], new[b], cards.get(b)), head.max_unavailable)
            over.extend(OverBudget(b, m, n, before.get(m, 0), head.max_unavailable(m)) for m, n in out.items())
        for b, revision in result.released.items():
            order.setdefault(b, releases[b].wave)
            served[b] = revision
        last_why = {b: s.why for b, s in result.status.items() if s.why}
        routed = {s.deployment for b in boxes if (c := at(served[b], b)) is not None for s in c.servers
                  if s.deployment not in result.held_out}
        after = serving()
        for model in sorted(kept - dark.keys()):
            if before.get(model, 0) and not after.get(model, 0):
                out_on = tuple(sorted({b for b, _ in result.out.get(model, ())}))
                dark[model] = Dark(model, out_on, before[model])
        now += step_s
        if rollout.state is not RolloutState.RUNNING:
            break
    changed = []
    stuck: dict[str, str] = {}
    for b in boxes:
        change = box_change(old[b], new[b], cards.get(b))
        if not change.boot:
            continue  # live fields only, or nothing: released at once, nothing restarts
        if b in order:
            changed.append(BoxWave(b, order[b], tuple(sorted(change.restarted)), tuple(sorted(change.started)),
                                   tuple(sorted(change.stopped))))
        else:
            stuck[b] = last_why.get(b, "not released")
    changed.sort(key=lambda w: (w.wave, w.box))
    return Waves(tuple(changed), rollout.waves if rollout is not None else 0, stuck, short, tuple(over),
                 tuple(dark[m] for m in sorted(dark)))

