"""`fleetllm show [DIR] [--format table|json]`: the placement as a table (boxes, servers, models at a
glance), or as JSON for scripts.

The JSON shape is stable (a change that breaks a reader bumps `format`):

    {"format": 1, "revision": "<sha>",
     "boxes": [{"name": str, "provider": str|null (null: the short form), "gateway_port": int|null,
                "servers": [{"name": str, "model": str, "weights": str, "port": int,
                             "max_model_len": int|null, "vram_gb": float|null}]}]}

With `--prices FILE` (a plan saved by `fleetllm plan --out`, whose `prices` the providers' listings gave,
or a file of that shape) the table has each box's cost and the JSON a `"cost"` key:

    "cost": {"total_per_hour": float, "boxes": {BOX: float}, "models": {MODEL: float}, "unpriced": [BOX]}

(USD per hour; a model's cost is its share of its boxes, by vram_gb: docs/cost.md).

Boxes and servers in the order of placement.yaml. The table's provider column says `static` for a box
in the short form (`- [model, port]` rows), which is what it means. The table is as wide as its content when stdout is
not a terminal (a pipe or a file): names are never cut to 80 columns there.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from fleetllm.cli.common import EXIT_OK, CommandError, add_repo_arguments, load_validation, require_valid
from fleetllm.core.cost import BoxPrice, FleetCost, PriceSource, fleet_cost, money, read_prices
from fleetllm.core.fleet.model import Fleet

FORMAT_VERSION = 1
UNBOUNDED_WIDTH = 100_000  # off a terminal: as wide as the table needs


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "show", description="Print every box and its servers." + __doc__.split("for scripts.")[1],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_repo_arguments(parser, positional=True)
    parser.add_argument("--format", choices=("table", "json"), default="table",
                        help="table (default) or json (the stable shape above)")
    parser.add_argument("--prices", metavar="FILE",
                        help="show what each box, model and the fleet cost, from FILE's `prices` (a plan saved by "
                             "`fleetllm plan --out FILE`)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    validation = load_validation(args.repo, args.rev)
    require_valid(validation)
    fleet = validation.fleet
    assert fleet is not None
    cost = fleet_cost(fleet, load_prices(args.prices)) if args.prices else None
    if args.format == "json":
        print(json.dumps(as_json(fleet, cost), indent=2))
        return EXIT_OK
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"fleet at {fleet.revision}")
    columns = ("box", "provider", "server", "model", "weights", "port", "max_model_len", "vram_gb")
    for column in (*columns, *(("$/h",) if cost is not None else ())):
        table.add_column(column)
    for box in fleet.boxes.values():
        for i, row in enumerate(box.servers):
            vllm = fleet.recipes[row.model].vllm
            table.add_row(box.name if i == 0 else "", str(box.rented_from) if i == 0 else "", row.name,
                          row.model, vllm.model,
                          str(row.port) if box.gateway_port is None else f"{row.port} (gateway :{box.gateway_port})",
                          str(vllm.max_model_len or ""), f"{vllm.vram_gb:g}" if vllm.vram_gb else "",
                          *((box_cost(cost, box.name) if i == 0 else "",) if cost is not None else ()))
    console = Console() if sys.stdout.isatty() else Console(width=UNBOUNDED_WIDTH)
    console.print(table)
    if cost is not None:
        for line in cost_lines(cost):
            console.print(line, highlight=False, markup=False)
    return EXIT_OK


def load_prices(path: str) -> dict[str, BoxPrice]:
    try:
        return read_prices(json.loads(Path(path).read_text(encoding="utf-8")))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise CommandError(f"--prices {path}: {exc}") from None


def box_cost(cost: FleetCost, box: str) -> str:
    price = cost.boxes.get(box)
    if price is None:
        return "unpriced" if box in cost.unpriced else ""
    return f"{money(price.per_hour)}" + (" (at most)" if price.source is PriceSource.CEILING else "")


def cost_lines(cost: FleetCost) -> list[str]:
    models = ", ".join(f"{model} {money(usd)}" for model, usd in cost.models.items())
    lines = [f"fleet: {money(cost.total)} for {len(cost.boxes)} priced box(es)"]
    if models:
        lines.append(f"models (a box's price shared by vram_gb): {models}")
    if cost.unpriced:
        lines.append(f"unpriced (not counted): {', '.join(cost.unpriced)}")
    return lines


def as_json(fleet: Fleet, cost: FleetCost | None = None) -> dict[str, Any]:
    """The placement in the documented shape (module docstring)."""
    boxes = []
    for box in fleet.boxes.values():
        servers = []
        for row in box.servers:
            vllm = fleet.recipes[row.model].vllm
            servers.append({"name": row.name, "model": row.model, "weights": vllm.model, "port": row.port,
                            "max_model_len": vllm.max_model_len, "vram_gb": vllm.vram_gb})
        boxes.append({"name": box.name, "provider": box.provider, "gateway_port": box.gateway_port,
                      "servers": servers})
    shown: dict[str, Any] = {"format": FORMAT_VERSION, "revision": fleet.revision, "boxes": boxes}
    if cost is not None:
        shown["cost"] = {"total_per_hour": round(cost.total, 4),
                         "boxes": {b: round(p.per_hour, 4) for b, p in cost.boxes.items()},
                         "models": {m: round(v, 4) for m, v in cost.models.items()}, "unpriced": list(cost.unpriced)}
    return shown
