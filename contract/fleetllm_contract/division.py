"""Stable card division: how much of a card each vLLM server may take, without moving the ones that run.

Standard library only: the installer divides its cards with it (fleetllm_installer.fit) and the control
plane predicts what a change restarts with the very same code (`box_change`, used by `fleetllm diff` and
the rollout engine).

vLLM reads `--gpu-memory-utilization` as a fraction of the card's total memory, once, at start. Changing a
running server's fraction means restarting it, which drops its in-flight requests. So when a card's server
set changes, the servers that stay as they are keep the fraction they run with, whenever the new set still
fits around them:

    fixed:  servers with their own gpu_memory_utilization reserve it (u_j * T)
    kept:   servers already running, unchanged, keep their current fraction s_k
    new:    every other server (added, or restarting anyway because its boot fields changed) needs
            need_i = w_i + kv_i        w_i: weights per GPU (vram_gb / GPUs it spans)
                                        kv_i: KV for one full-length sequence (kv_bytes_per_token x
                                              max_model_len) when known, else KV_FLOOR x T
    free  = CEILING x T - sum(u_j x T) - sum(s_k x T)
    fits  when every kept s_k x T still holds w_k and sum(need_i) <= free
    then  u_i = (w_i + c_i / sum(c) x (free - sum(w_i))) / T   over the new servers only (c as in a
          fresh division: KV need when every new server states it, else 1)

When it does not fit, the whole card is divided afresh (`fresh`: the formula in
fleetllm_installer.fit's docstring) and every auto-divided server on it restarts. A removal never
re-divides: it only frees memory, which the next server added (or the next fresh division) takes. The
division is deterministic (names are sorted) and never gives a card more than CEILING of it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

CEILING = 0.90  # headroom for CUDA contexts and allocations outside vLLM's budget
KV_FLOOR = 0.05  # of the card: the least KV room a new server gets when its KV need is unknown
GIB = float(1 << 30)
PARALLEL_FLAGS = {
    "--tensor-parallel-size": "tp", "-tp": "tp",
    "--pipeline-parallel-size": "pp", "-pp": "pp",
    "--data-parallel-size": "dp", "-dp": "dp",
}
EPSILON = 1e-9
ROUNDING = 0.001  # fractions are written rounded down to 3 decimals (`rounded`)


def gpus_needed(args: Sequence[str]) -> int:
    """tensor x pipeline x data parallel size, as vLLM reads them from its arguments."""
    sizes = {"tp": 1, "pp": 1, "dp": 1}
    for i, token in enumerate(args):
        flag, eq, inline = token.partition("=")
        kind = PARALLEL_FLAGS.get(flag)
        if kind is None:
            continue
        raw = inline if eq else (args[i + 1] if i + 1 < len(args) else "")
        # ASCII digits only (str.isdigit() takes "²", which int() refuses), and few of them
        if re.fullmatch(r"[0-9]{1,4}", raw) and int(raw) > 0:
            sizes[kind] = int(raw)
    return sizes["tp"] * sizes["pp"] * sizes["dp"]


@dataclass(frozen=True)
class Demand:
    """What one server on one card asks for."""

    name: str
    weights_gb: float  # weights per GPU (vram_gb / GPUs it spans), 0 when unknown
    fixed: float | None = None  # its own gpu_memory_utilization: reserved, never divided
    kv_gb: float | None = None  # KV for one full-length sequence, when the recipe states both factors

    @property
    def weight(self) -> float:
        """Its weight in a division of what is left (KV need; `divide` falls back to equal shares)."""
        return self.kv_gb or 0.0


@dataclass(frozen=True)
class Division:
    """Each auto-divided server's fraction of the card, and whether the running ones kept theirs."""

    shares: Mapping[str, float]
    kept: frozenset[str]  # servers whose current fraction was kept as it is
    redivided: bool  # the new set did not fit around the current fractions: divided afresh


def _reservation(demand: Demand, total_gb: float) -> float:
    return demand.fixed * total_gb if demand.fixed is not None else demand.weights_gb


def _split(auto: Sequence[Demand], left_gb: float, total_gb: float) -> dict[str, float]:
    """Weights plus a part of `left_gb` (by KV need when every server states it, else equal)."""
    left_gb = max(left_gb, 0.0)
    by_kv = all(d.kv_gb for d in auto)
    weights = {d.name: d.weight if by_kv else 1.0 for d in auto}
    total_weight = sum(weights.values()) or 1.0
    return {d.name: (d.weights_gb + weights[d.name] / total_weight * left_gb) / total_gb for d in auto}


def fresh(card: Iterable[Demand], total_gb: float) -> dict[str, float]:
    """Today's division of a whole card: every auto server gets its weights and a part of what is left."""
    ordered = sorted(card, key=lambda d: d.name)
    auto = [d for d in ordered if d.fixed is None]
    left = CEILING * total_gb - sum(_reservation(d, total_gb) for d in ordered)
    return _split(auto, left, total_gb)


def need_gb(demand: Demand, total_gb: float) -> float:
    """The least a new server can start with: its weights and KV for one sequence (or KV_FLOOR of the card)."""
    kv = demand.kv_gb if demand.kv_gb else KV_FLOOR * total_gb
    return demand.weights_gb + kv


def divide(card: Iterable[Demand], total_gb: float, current: Mapping[str, float] | None = None) -> Division:
    """The stable division of one card. `current`: the fractions that servers running unchanged on this
    card use now (servers whose boot fields change must not be in it: they restart anyway)."""
    ordered = sorted(card, key=lambda d: d.name)
    auto = [d for d in ordered if d.fixed is None]
    if total_gb <= 0:
        return Division({}, frozenset(), False)
    keep = {d.name: current[d.name] for d in auto if current and d.name in current}
    if keep:
        by_name = {d.name: d for d in auto}
        # a kept fraction still holds its weights (up to the rounding of what was written): else the card
        # changed under it, and it is divided afresh
        holds = all(share > 0 and (share + ROUNDING) * total_gb + EPSILON >= by_name[name].weights_gb
                    for name, share in keep.items())
        new = [d for d in auto if d.name not in keep]
        free = (CEILING * total_gb - sum(_reservation(d, total_gb) for d in ordered if d.fixed is not None)
                - sum(share * total_gb for share in keep.values()))
        if holds and sum(need_gb(d, total_gb) for d in new) <= free + EPSILON:
            shares = dict(keep)
            shares.update(_split(new, free - sum(d.weights_gb for d in new), total_gb))
            return Division(shares, frozenset(keep), False)
    return Division(fresh(ordered, total_gb), frozenset(), bool(keep))


def rounded(fraction: float) -> float:
    """A fraction as written on vLLM's command line: rounded down to 3 decimals (never up, so the sum
    stays under the ceiling), with a tolerance for floating-point error (0.415 * 1000 = 414.99999...)."""
    return math.floor(fraction * 1000 + 1e-6) / 1000


# -- What a change of a box's JSON does to its processes (control plane side) ---------------------------


@dataclass(frozen=True)
class BoxChange:
    """Server names (the box JSON's `name`) by what the box does with them when it applies a new JSON: the
    one type for it (the rollout's fleetllm.core.rollout.change.box_change returns it too)."""

    started: frozenset[str]
    restarted: frozenset[str]  # a boot field or its share of the card changes
    stopped: frozenset[str]
    unchanged: frozenset[str]
    redivided: bool = False  # the new set did not fit around the running shares: the card was divided afresh
    card_known: bool = True  # False: no card size, so neighbours were counted as restarting when a server came

    @property
    def disrupted(self) -> frozenset[str]:
        """Servers that stop serving for a while: restarted or removed (added ones are not)."""
        return self.restarted | self.stopped

    @property
    def boot(self) -> bool:
        """The box has anything to do: a server starts, restarts or stops."""
        return bool(self.started or self.restarted or self.stopped)


def _servers(box: Mapping[str, Any] | None) -> dict[str, Mapping[str, Any]]:
    out: dict[str, Mapping[str, Any]] = {}
    for entry in (box or {}).get("servers") or ():
        if isinstance(entry, Mapping) and isinstance(entry.get("name"), str):
            out[entry["name"]] = entry
    return out


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def demand_of(entry: Mapping[str, Any]) -> Demand:
    """A box JSON server entry's demand on one card (its weights per GPU)."""
    raw_args = entry.get("args")
    args = [a for a in raw_args if isinstance(a, str)] if isinstance(raw_args, list) else (
        raw_args.split() if isinstance(raw_args, str) else [])
    weights = (_number(entry.get("vram_gb")) or 0.0) / gpus_needed(args)
    kv, length = _number(entry.get("kv_bytes_per_token")), _number(entry.get("max_model_len"))
    return Demand(str(entry.get("name")), weights, _number(entry.get("gpu_memory_utilization")),
                  kv * length / GIB if kv and length else None)


def _same(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """The same boot config: the digest when both carry one (it covers every boot field but the bearer),
    and the bearer; else the whole entry."""
    if a.get("digest") and b.get("digest"):
        return a.get("digest") == b.get("digest") and a.get("api_key") == b.get("api_key")
    return dict(a) == dict(b)


def box_change(old_box_json: Mapping[str, Any] | None, new_box_json: Mapping[str, Any] | None,
               card_gb: float | None, *, current: Mapping[str, float] | None = None) -> BoxChange:
    """What a box does when it goes from one box JSON to the next: which servers start, restart, stop.

    `card_gb`: one card's memory (placement.yaml gpu_memory_gb); the servers are taken to share one card.
    `current`: the fractions the box runs with, when known; else the old JSON's fresh division (what a
    fresh install of it gives). Without `card_gb` nothing can be measured, so a removal keeps every
    share and anything that adds demand (a server started, or one restarting with new fields) is counted
    as restarting every auto-divided neighbour: the safe side for a disruption budget.
    """
    old, new = _servers(old_box_json), _servers(new_box_json)
    started = frozenset(new) - frozenset(old)
    stopped = frozenset(old) - frozenset(new)
    common = frozenset(old) & frozenset(new)
    changed = frozenset(n for n in common if not _same(old[n], new[n]))
    steady = common - changed
    demands = {name: demand_of(entry) for name, entry in new.items()}
    auto_steady = frozenset(n for n in steady if demands[n].fixed is None)
    if not auto_steady:
        return BoxChange(started, changed, stopped, steady)
    if card_gb is None or not (_number(card_gb) or 0) > 0:
        # a changed server whose demand on the card is the same (new args, same weights and KV) fits in
        # the share it had, so only a start or a changed demand can move the neighbours
        grows = bool(started) or any(demand_of(old[n]) != demand_of(new[n]) for n in changed)
        moved = auto_steady if grows else frozenset()
        return BoxChange(started, changed | moved, stopped, steady - moved, redivided=grows, card_known=False)
    total = float(card_gb)
    if current is None:
        current = fresh([demand_of(e) for e in old.values()], total)
    running = {n: rounded(current[n]) for n in auto_steady if n in current}
    division = divide(demands.values(), total, running)
    moved = frozenset(n for n in auto_steady
                      if n not in running or rounded(division.shares.get(n, 0.0)) != running[n])
    return BoxChange(started, changed | moved, stopped, steady - moved, redivided=division.redivided)


__all__ = ["CEILING", "GIB", "KV_FLOOR", "BoxChange", "Demand", "Division", "box_change", "demand_of", "divide",
           "fresh", "gpus_needed", "need_gb", "rounded"]
