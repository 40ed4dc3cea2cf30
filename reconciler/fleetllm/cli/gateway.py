"""`fleetllm gateway --config FILE [--check] [--box-json] [--workers N]
[--busy-poll MICROSECONDS] [--log-level LEVEL]`: the box gateway (same as
`fleetllm-gateway`)."""

from __future__ import annotations

import argparse
from typing import Any

from fleetllm_gateway import cli


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "gateway",
        description="Route OpenAI-style requests to one backend per model by the body's `model` or a "
                    "/route/{model}/ prefix. --check validates the config without binding (exit 0 valid, 1 invalid).")
    cli.add_arguments(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    return cli.run_parsed(args)
