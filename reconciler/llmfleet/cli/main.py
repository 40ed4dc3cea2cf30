"""`llmfleet`: the command line. Each subcommand lives in reconciler/commands/<name>.py and exposes
`register(subparsers)`, which adds its parser and sets `run(args) -> exit code`."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from llmfleet import __version__
from llmfleet.cli.common import EXIT_OK, EXIT_USAGE

# Subcommand modules, in the order `llmfleet --help` lists them.
COMMANDS = ("validate", "render", "api_key", "show", "diff", "gateway", "serve", "approve", "plan", "apply",
            "reconcile", "demo")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llmfleet",
        description="Run a self-hosted vLLM fleet from git.",
    )
    parser.add_argument("--version", action="version", version=f"llmfleet {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"llmfleet.cli.{name}").register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        code: int = args.run(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `llmfleet render x | head`
        return EXIT_OK
    return code
