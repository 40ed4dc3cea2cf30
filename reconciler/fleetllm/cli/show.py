"""`fleetllm show [DIR] [--format table|json]`: the placement as a table (boxes, servers, models at a
glance), or as JSON for scripts.

The JSON shape is stable (a change that breaks a reader bumps `format`):

    {"format": 1, "revision": "<sha>",
     "boxes": [{"name": str, "provider": str|null (null: the short form), "gateway_port": int|null,
                "servers": [{"name": str, "model": str, "weights": str, "port": int,
                             "max_model_len": int|null, "vram_gb": float|null}]}]}

Boxes and servers in the order of placement.yaml. The table's provider column says `static` for a box
in the short form (`- [model, port]` rows), which is what it means. The table is as wide as its content when stdout is
not a terminal (a pipe or a file): names are never cut to 80 columns there.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from fleetllm.cli.common import EXIT_OK, add_repo_arguments, load_validation, require_valid
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
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    validation = load_validation(args.repo, args.rev)
    require_valid(validation)
    fleet = validation.fleet
    assert fleet is not None
    if args.format == "json":
        print(json.dumps(as_json(fleet), indent=2))
        return EXIT_OK
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"fleet at {fleet.revision}")
    for column in ("box", "provider", "server", "model", "weights", "port", "max_model_len", "vram_gb"):
        table.add_column(column)
    for box in fleet.boxes.values():
        for i, row in enumerate(box.servers):
            vllm = fleet.recipes[row.model].vllm
            table.add_row(box.name if i == 0 else "", str(box.rented_from) if i == 0 else "", row.name,
                          row.model, vllm.model,
                          str(row.port) if box.gateway_port is None else f"{row.port} (gateway :{box.gateway_port})",
                          str(vllm.max_model_len or ""), f"{vllm.vram_gb:g}" if vllm.vram_gb else "")
    (Console() if sys.stdout.isatty() else Console(width=UNBOUNDED_WIDTH)).print(table)
    return EXIT_OK


def as_json(fleet: Fleet) -> dict[str, Any]:
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
    return {"format": FORMAT_VERSION, "revision": fleet.revision, "boxes": boxes}
