"""The move-model scenario's change: one server moves to another box, as a two-line edit of
placement.yaml (its row leaves one box, a row on a free listen port joins another). Pure.

Which server: the last row of the first box that runs more than one server (so the box keeps
serving), not a legacy pair and not behind a box gateway. Where to: of the other boxes without a
gateway or a legacy pair, with a free listen port and room for one more server, the one with the most
GPU memory left after the move.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleetllm.core.fleet import strictyaml
from fleetllm.core.fleet.files import PLACEMENT_FILE
from fleetllm.core.fleet.jsonvalue import JSON
from fleetllm.core.fleet.model import Box, Fleet, ServerRow
from fleetllm.demo.fleet import DEFAULT_GPU_MEMORY_GB, DemoError

CEILING = 0.90  # the installer's fit ceiling (fleetllm_installer.fit.CEILING): a move must fit the simulated card


@dataclass(frozen=True)
class Move:
    model: str
    name: str  # the process name (the row's third element, else the model)
    source: str
    source_port: int
    target: str
    target_port: int

    def row(self) -> str:
        third = f", {self.name}" if self.name != self.model else ""
        return f"[{self.model}, {self.target_port}{third}]"

    def __str__(self) -> str:
        return f"{self.model} from {self.source}:{self.source_port} to {self.target}:{self.target_port}"


def _movable(fleet: Fleet, box: Box, row: ServerRow) -> bool:
    return box.gateway_port is None and not fleet.settings.is_legacy(box.name, row.port)


def _room(fleet: Fleet, box: Box, extra: ServerRow) -> float:
    """GPU memory left on `box` with `extra` added to it (negative: it would not fit)."""
    vram = sum(fleet.recipes[r.model].vllm.vram_gb or 0 for r in (*box.servers, extra))
    return CEILING * (box.gpu_memory_gb or DEFAULT_GPU_MEMORY_GB) - vram


def choose_move(fleet: Fleet) -> Move:
    for source in fleet.boxes.values():
        rows = [r for r in source.servers if _movable(fleet, source, r)]
        if len(source.servers) < 2 or not rows:
            continue
        row = rows[-1]
        best: tuple[float, Box, int] | None = None
        for target in fleet.boxes.values():
            if (target.name == source.name or target.gateway_port is not None
                    or any(fleet.settings.is_legacy(target.name, r.port) for r in target.servers)):
                continue
            used = {r.port for r in target.servers}
            free = [p for p in fleet.settings.listen_ports if p not in used]
            names = {r.name for r in target.servers}
            if not free or len(target.servers) >= fleet.settings.max_servers_per_box or row.name in names:
                continue
            room = _room(fleet, target, row)
            if room >= 0 and (best is None or room > best[0]):
                best = (room, target, free[0])
        if best is not None:
            return Move(row.model, row.name, source.name, row.port, best[1].name, best[2])
    raise DemoError("the move-model scenario found no server to move: it needs a box with two servers and "
                    "another box with a free listen port and enough GPU memory")


def move_row(placement: str, move: Move) -> str:
    """placement.yaml's text with the row moved; every other line as it was."""
    doc = strictyaml.load(placement, PLACEMENT_FILE)
    hosts = doc.value.get("hosts") if isinstance(doc.value, dict) else None
    if not isinstance(hosts, dict):
        raise DemoError(f"{PLACEMENT_FILE} has no hosts mapping")

    def rows_path(box: str) -> list[str | int]:
        return ["hosts", box, "servers"] if isinstance(hosts.get(box), dict) else ["hosts", box]

    def rows(box: str) -> list[JSON]:
        value = hosts.get(box)
        found = value.get("servers") if isinstance(value, dict) else value
        return found if isinstance(found, list) else []

    lines = placement.split("\n")
    source_rows = rows(move.source)
    index = next((i for i, r in enumerate(source_rows) if isinstance(r, list) and len(r) >= 2
                  and r[1] == move.source_port), None)
    target_rows = rows(move.target)
    if index is None or not target_rows:
        raise DemoError(f"{PLACEMENT_FILE}: cannot find the rows of {move.source}:{move.source_port} and "
                        f"{move.target}")
    remove = doc.mark_at([*rows_path(move.source), index]).line
    last = doc.mark_at([*rows_path(move.target), len(target_rows) - 1]).line
    for number in (remove, last):
        if not lines[number - 1].lstrip().startswith("- ["):
            raise DemoError(f"{PLACEMENT_FILE}:{number}: a row written over several lines; the scenario edits "
                            "one-line rows such as `- [model, 8001]`")
    indent = lines[last - 1][: len(lines[last - 1]) - len(lines[last - 1].lstrip())]
    lines.insert(last, f"{indent}- {move.row()}")
    del lines[remove - 1 if remove <= last else remove]  # the insert shifted the lines after it
    return "\n".join(lines)


def remove_box(placement: str, box: str) -> str:
    """placement.yaml's text without `box`: its key, every line under it, the comment lines just above it and
    one blank line (a box removed in a pull request); every other line as it was."""
    lines = placement.split("\n")
    start = next((i for i, line in enumerate(lines) if line.strip() in (f"{box}:", f'"{box}":', f"'{box}':")), None)
    if start is None:
        raise DemoError(f"{PLACEMENT_FILE}: no box {box} to remove")
    indent = len(lines[start]) - len(lines[start].lstrip())
    end = start + 1
    while end < len(lines) and (not lines[end].strip() or len(lines[end]) - len(lines[end].lstrip()) > indent):
        end += 1
    while end > start + 1 and not lines[end - 1].strip():
        end -= 1  # the blank lines after its block stay
    while start > 0 and lines[start - 1].strip().startswith("#") and \
            len(lines[start - 1]) - len(lines[start - 1].lstrip()) == indent:
        start -= 1
    if start > 0 and not lines[start - 1].strip():
        start -= 1
    return "\n".join(lines[:start] + lines[end:])
