"""Fit check and card division: pure functions over the box JSON and what the box measured.

Placement on cards. A server needs k = tensor x pipeline x data parallel size GPUs (from its args,
default 1) and puts vram_gb / k of weights on each. One GPU: everything shares it. Several GPUs:
servers are placed first-fit-decreasing (most GPUs, then most weights, then name) onto the GPUs with
the most room left, and each gets CUDA_VISIBLE_DEVICES for its cards.

Fit. Per GPU g with total memory T_g (GiB, from nvidia-smi's memory.total, so a re-install while our
own servers hold the card still measures the card, not what they left free):

    sum(u_j * T_g for explicit servers j on g) + sum(w_i for the other servers i on g) <= CEILING * T_g

where u_j is a server's own gpu_memory_utilization, w_i its weights per GPU (vram_gb / k), and
CEILING = 0.90 keeps headroom for CUDA contexts and allocations outside vLLM's budget. Disk: the sum of
disk_gb, less what the Hugging Face cache already holds of each model, must fit in the free space.

Card division, for a server i without gpu_memory_utilization on GPU g:

    R_g    = CEILING * T_g - sum(reservations on g)      (what is left once every weight is reserved)
    share_i = c_i / sum(c over the auto servers on g)    c = kv_bytes_per_token * max_model_len when every
                                                          auto server on g has both (KV for one full-length
                                                          sequence), else 1 (equal shares)
    u_i,g  = (w_i + share_i * R_g) / T_g
    gpu_memory_utilization_i = min over its GPUs of u_i,g, rounded down to 3 decimals

vLLM reads the fraction against the card's total memory, so the fractions on a card sum to at most
CEILING.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from llmfleet_installer.boxjson import ServerSpec
from llmfleet_installer.hardware import Gpu

CEILING = 0.90
PARALLEL_FLAGS = {
    "--tensor-parallel-size": "tp", "-tp": "tp",
    "--pipeline-parallel-size": "pp", "-pp": "pp",
    "--data-parallel-size": "dp", "-dp": "dp",
}


@dataclass(frozen=True)
class Placement:
    """Where one server runs and how much of its cards it may take."""

    gpus: tuple[int, ...]  # GPU indices; empty when the GPUs are unknown
    gpu_memory_utilization: float | None  # None: leave vLLM's default (only when nothing was measured)
    after: tuple[str, ...]  # earlier servers (name order) that share a card: boot after them


@dataclass(frozen=True)
class FitResult:
    ok: bool
    gpus: tuple[Gpu, ...]
    vram_needed_gb: float
    vram_total_gb: float
    disk_needed_gb: float
    disk_free_gb: float | None
    problems: tuple[str, ...]
    placements: Mapping[str, Placement] = field(default_factory=dict)


def gpus_needed(args: tuple[str, ...]) -> int:
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


def _gb(value: float) -> str:
    return f"{value:.1f} GB"


def _weights(server: ServerSpec) -> float:
    return (server.vram_gb or 0.0) / gpus_needed(server.args)


def _reservation(server: ServerSpec, gpu: Gpu) -> float:
    if server.gpu_memory_utilization is not None:
        return server.gpu_memory_utilization * gpu.total_gb
    return _weights(server)


def place(servers: tuple[ServerSpec, ...], gpus: tuple[Gpu, ...]) -> tuple[dict[str, tuple[int, ...]], list[str]]:
    """Assign each server its GPUs. Returns the assignment and placement problems."""
    problems: list[str] = []
    if len(gpus) == 1:
        problems.extend(f"{s.name} needs {gpus_needed(s.args)} GPUs (parallel size in its args), this box has 1"
                        for s in servers if gpus_needed(s.args) > 1)
        return {s.name: (gpus[0].index,) for s in servers}, problems
    room = {g.index: CEILING * g.total_gb for g in gpus}
    by_index = {g.index: g for g in gpus}
    assignment: dict[str, tuple[int, ...]] = {}
    for s in sorted(servers, key=lambda s: (-gpus_needed(s.args), -_weights(s), s.name)):
        k = gpus_needed(s.args)
        if k > len(gpus):
            problems.append(f"{s.name} needs {k} GPUs (parallel size in its args), this box has {len(gpus)}")
        candidates = sorted(room, key=lambda i: (-room[i], i))
        fitting = [i for i in candidates if room[i] >= _reservation(s, by_index[i])]
        chosen = (fitting if len(fitting) >= k else candidates)[:k]
        for i in chosen:
            room[i] -= _reservation(s, by_index[i])
        assignment[s.name] = tuple(sorted(chosen))
    return assignment, problems


def _divide(card: list[ServerSpec], gpu: Gpu) -> dict[str, float]:
    """Each auto server's fraction of this card (the formula in the module docstring)."""
    auto = [s for s in card if s.gpu_memory_utilization is None]
    left = CEILING * gpu.total_gb - sum(_reservation(s, gpu) for s in card)
    left = max(left, 0.0)
    if all(s.kv_bytes_per_token and s.max_model_len for s in auto):
        weights = {s.name: float((s.kv_bytes_per_token or 0) * (s.max_model_len or 0)) for s in auto}
    else:
        weights = {s.name: 1.0 for s in auto}
    total_weight = sum(weights.values()) or 1.0
    return {s.name: (_weights(s) + weights[s.name] / total_weight * left) / gpu.total_gb for s in auto}


def _card_problems(card: list[ServerSpec], gpu: Gpu) -> list[str]:
    problems = []
    needed = sum(_reservation(s, gpu) for s in card)
    if needed > CEILING * gpu.total_gb + 1e-9:
        parts = ", ".join(
            f"{s.name} {_gb(_reservation(s, gpu))}"
            + (f" (gpu_memory_utilization {s.gpu_memory_utilization})" if s.gpu_memory_utilization else "")
            for s in card)
        problems.append(f"GPU {gpu.index} ({gpu.name}, {_gb(gpu.total_gb)}): needs {_gb(needed)} "
                        f"[{parts}] but only {_gb(CEILING * gpu.total_gb)} ({CEILING:.0%}) may be used")
    problems.extend(f"{s.name}: {_gb(_weights(s))} of weights per GPU do not fit in its own "
                    f"gpu_memory_utilization {s.gpu_memory_utilization} of GPU {gpu.index} "
                    f"({_gb(s.gpu_memory_utilization * gpu.total_gb)})"
                    for s in card
                    if s.gpu_memory_utilization is not None and _weights(s) > s.gpu_memory_utilization * gpu.total_gb)
    return problems


def check_fit(servers: tuple[ServerSpec, ...], gpus: tuple[Gpu, ...] | None, disk_free_gb: float | None,
              cached_gb: Mapping[str, float] | None = None, probe_problems: tuple[str, ...] = ()) -> FitResult:
    """Fit check, placement and card division in one pass. `gpus=None`: the GPUs could not be probed."""
    cached = cached_gb or {}
    problems = list(probe_problems)
    ordered = tuple(sorted(servers, key=lambda s: s.name))
    vram_needed = sum(s.vram_gb or 0.0 for s in ordered)
    disk_needed = sum(max((s.disk_gb or 0.0) - cached.get(s.name, 0.0), 0.0) for s in ordered)
    if disk_free_gb is not None and disk_needed > disk_free_gb:
        detail = ", ".join(f"{s.name} {_gb(max((s.disk_gb or 0.0) - cached.get(s.name, 0.0), 0.0))}"
                           for s in ordered if s.disk_gb)
        problems.append(f"disk: needs {_gb(disk_needed)} more for weights [{detail}] but {_gb(disk_free_gb)} is free")

    if not gpus:
        placements = {s.name: Placement((), s.gpu_memory_utilization, tuple(o.name for o in ordered[:i]))
                      for i, s in enumerate(ordered)}
        return FitResult(ok=not problems and gpus is not None, gpus=(), vram_needed_gb=vram_needed,
                         vram_total_gb=0.0, disk_needed_gb=disk_needed, disk_free_gb=disk_free_gb,
                         problems=tuple(problems), placements=placements)

    assignment, placement_problems = place(ordered, gpus)
    problems.extend(placement_problems)
    fractions: dict[str, list[float]] = {s.name: [] for s in ordered}
    for gpu in gpus:
        card = [s for s in ordered if gpu.index in assignment[s.name]]
        problems.extend(_card_problems(card, gpu))
        for name, fraction in _divide(card, gpu).items():
            fractions[name].append(fraction)
    placements = {}
    for i, s in enumerate(ordered):
        util = s.gpu_memory_utilization
        if util is None and fractions[s.name]:
            util = math.floor(min(fractions[s.name]) * 1000) / 1000
            if util <= 0:
                problems.append(f"{s.name}: no GPU memory is left for it once the other servers are reserved")
        after = tuple(o.name for o in ordered[:i] if set(assignment[o.name]) & set(assignment[s.name]))
        placements[s.name] = Placement(assignment[s.name], util, after)
    return FitResult(ok=not problems, gpus=gpus, vram_needed_gb=vram_needed,
                     vram_total_gb=sum(g.total_gb for g in gpus), disk_needed_gb=disk_needed,
                     disk_free_gb=disk_free_gb, problems=tuple(problems), placements=placements)
