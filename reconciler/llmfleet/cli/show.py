"""`llmfleet show [DIR]`: the placement as a table (boxes, servers, models, lifetimes at a glance)."""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console
from rich.table import Table

from llmfleet.cli.common import EXIT_OK, add_repo_arguments, load_validation, require_valid


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "show", help="print the placement as a table", description="Print every box and its servers.")
    add_repo_arguments(parser, positional=True)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    validation = load_validation(args.repo, args.rev)
    require_valid(validation)
    fleet = validation.fleet
    assert fleet is not None
    table = Table(title=f"fleet at {fleet.revision}")
    for column in ("box", "provider", "server", "model", "weights", "port", "max_model_len", "vram_gb"):
        table.add_column(column)
    for box in fleet.boxes.values():
        for i, row in enumerate(box.servers):
            vllm = fleet.recipes[row.model].vllm
            table.add_row(box.name if i == 0 else "", (box.provider or "") if i == 0 else "", row.name,
                          row.model, vllm.model,
                          str(row.port) if box.gateway_port is None else f"{row.port} (gateway :{box.gateway_port})",
                          str(vllm.max_model_len or ""), f"{vllm.vram_gb:g}" if vllm.vram_gb else "")
    Console().print(table)
    return EXIT_OK
