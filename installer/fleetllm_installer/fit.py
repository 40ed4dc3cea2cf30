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

Stability (fleetllm_contract.division). A re-install passes what the last install wrote for servers that
run unchanged (`Running`, read back from their Supervisor programs by running.py). Those keep their GPUs,
their fraction and their start order (`after`; every server has one Supervisor priority) whenever the new set still fits
around them, so `supervisorctl update` sees their programs unchanged and does not restart them; new
servers take from what is left and start after them. When the new set does not fit, the card is divided
afresh as above.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from fleetllm_contract.division import CEILING, GIB, PARALLEL_FLAGS, Demand, divide, gpus_needed, rounded
from fleetllm_installer.boxjson import ServerSpec
from fleetllm_installer.hardware import Gpu

__all__ = ["CEILING", "PARALLEL_FLAGS", "FitResult", "Placement", "Running", "check_fit", "gpus_needed", "place"]


@dataclass(frozen=True)
class Placement:
    """Where one server runs and how much of its cards it may take."""

    gpus: tuple[int, ...]  # GPU indices; empty when the GPUs are unknown
    gpu_memory_utilization: float | None  # None: leave vLLM's default (only when nothing was measured)
    after: tuple[str, ...]  # earlier servers (name order) that share a card: boot after them
    after_ports: Mapping[str, int] = field(default_factory=dict)  # kept `after` entries' ports as written


@dataclass(frozen=True)
class Running:
    """What the last install wrote for a server that runs unchanged (same digest and bearer)."""

    share: float | None  # its --gpu-memory-utilization, None when it had none
    gpus: tuple[int, ...]  # CUDA_VISIBLE_DEVICES, empty on a one-GPU box
    after: tuple[str, ...]  # the servers it boots after
    after_ports: Mapping[str, int] = field(default_factory=dict)  # their ports, as written


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


def _gb(value: float) -> str:
    return f"{value:.1f} GB"


def _weights(server: ServerSpec) -> float:
    return (server.vram_gb or 0.0) / gpus_needed(server.args)


def _reservation(server: ServerSpec, gpu: Gpu) -> float:
    if server.gpu_memory_utilization is not None:
        return server.gpu_memory_utilization * gpu.total_gb
    return _weights(server)


def place(servers: tuple[ServerSpec, ...], gpus: tuple[Gpu, ...],
          running: Mapping[str, Running] | None = None) -> tuple[dict[str, tuple[int, ...]], list[str]]:
    """Assign each server its GPUs. Returns the assignment and placement problems. A running server
    keeps the GPUs it has (when they are all still there and as many as it needs); the others are
    placed first-fit-decreasing around them."""
    problems: list[str] = []
    if len(gpus) == 1:
        problems.extend(f"{s.name} needs {gpus_needed(s.args)} GPUs (parallel size in its args), this box has 1"
                        for s in servers if gpus_needed(s.args) > 1)
        return {s.name: (gpus[0].index,) for s in servers}, problems
    room = {g.index: CEILING * g.total_gb for g in gpus}
    by_index = {g.index: g for g in gpus}
    assignment: dict[str, tuple[int, ...]] = {}
    for s in sorted(servers, key=lambda s: s.name):
        kept = (running or {}).get(s.name)
        if (kept is not None and len(set(kept.gpus)) == gpus_needed(s.args) == len(kept.gpus)
                and all(i in room for i in kept.gpus)):
            for i in kept.gpus:
                room[i] -= _reservation(s, by_index[i])
            assignment[s.name] = tuple(sorted(kept.gpus))
    for s in sorted(servers, key=lambda s: (-gpus_needed(s.args), -_weights(s), s.name)):
        if s.name in assignment:
            continue
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


def demand(server: ServerSpec) -> Demand:
    """A server's demand on each of its cards (fleetllm_contract.division)."""
    kv = (server.kv_bytes_per_token * server.max_model_len / GIB
          if server.kv_bytes_per_token and server.max_model_len else None)
    return Demand(server.name, _weights(server), server.gpu_memory_utilization, kv)


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
              cached_gb: Mapping[str, float] | None = None, probe_problems: tuple[str, ...] = (),
              running: Mapping[str, Running] | None = None) -> FitResult:
    """Fit check, placement and card division in one pass. `gpus=None`: the GPUs could not be probed.
    `running`: what the last install wrote for the servers that run unchanged (kept where they fit)."""
    cached = cached_gb or {}
    names = {s.name for s in servers}
    running = {name: r for name, r in (running or {}).items() if name in names}
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

    assignment, placement_problems = place(ordered, gpus, running)
    problems.extend(placement_problems)
    # a running server is where it was: same GPUs (none recorded on a one-GPU box)
    in_place = {n for n, r in running.items() if tuple(sorted(r.gpus)) in ((), assignment[n])}
    fractions: dict[str, list[float]] = {s.name: [] for s in ordered}
    kept_on: dict[str, int] = {s.name: 0 for s in ordered}  # on how many of its cards it kept its fraction
    for gpu in gpus:
        card = [s for s in ordered if gpu.index in assignment[s.name]]
        problems.extend(_card_problems(card, gpu))
        current = {s.name: share for s in card if s.name in in_place and (share := running[s.name].share) is not None}
        division = divide([demand(s) for s in card], gpu.total_gb, current)
        for name, fraction in division.shares.items():
            fractions[name].append(fraction)
        for name in division.kept:
            kept_on[name] += 1
    # A server stays as it runs when it is where it was and keeps its fraction (or sets its own).
    steady = {s.name for s in ordered if s.name in in_place and (
        s.gpu_memory_utilization is not None or kept_on[s.name] == len(assignment[s.name]))}
    placements = {}
    for s in ordered:
        util = s.gpu_memory_utilization
        if s.name in steady and util is None:
            util = running[s.name].share
        elif util is None and fractions[s.name]:
            util = rounded(min(fractions[s.name]))
            if util <= 0:
                problems.append(f"{s.name}: no GPU memory is left for it once the other servers are reserved")
        sharing = [o.name for o in ordered if o.name != s.name and set(assignment[o.name]) & set(assignment[s.name])]
        after_ports: Mapping[str, int] = {}
        if s.name in steady:  # as written, even a neighbour that left: the launcher skips those (PRESENT)
            after = running[s.name].after
            after_ports = running[s.name].after_ports
        else:  # after the steady neighbours (they run already; not one that waits for it), then new ones by name
            after = tuple(n for n in sharing if (n not in steady and n < s.name)
                          or (n in steady and s.name not in running[n].after))
        placements[s.name] = Placement(assignment[s.name], util, after, after_ports)
    return FitResult(ok=not problems, gpus=gpus, vram_needed_gb=vram_needed,
                     vram_total_gb=sum(g.total_gb for g in gpus), disk_needed_gb=disk_needed,
                     disk_free_gb=disk_free_gb, problems=tuple(problems), placements=placements)
