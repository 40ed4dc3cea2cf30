"""`llmfleet`: the command line. Each subcommand lives in llmfleet/cli/<name>.py and exposes
`register(subparsers)`, which adds its parser and sets `run(args) -> exit code`.

Errors are mapped to exit codes here, once: a LlmfleetError (llmfleet.errors) prints
`llmfleet COMMAND: message` on stderr and exits with its `exit_code`; nothing else is caught, so a bug
still shows its traceback. Options are never taken by an abbreviation (`--conf` is not `--config`)."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Any

from llmfleet import __version__
from llmfleet.cli.common import EXIT_OK, EXIT_USAGE, eprint
from llmfleet.errors import LlmfleetError
from llmfleet.logs import resolve_level, setup_logging

# Subcommand modules, in the order `llmfleet --help` lists them.
COMMANDS = ("validate", "render", "api_key", "show", "diff", "gateway", "serve", "approve", "import_llmao", "plan",
            "apply", "reconcile", "control", "rollout", "demo")


class Parser(argparse.ArgumentParser):
    """argparse without prefix matching: an abbreviated option is an error, not a guess."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="llmfleet", description="Run a self-hosted vLLM fleet from git.")
    parser.add_argument("--version", action="version", version=f"llmfleet {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for name in COMMANDS:
        importlib.import_module(f"llmfleet.cli.{name}").register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:  # `--log-level` (serve, reconcile, gateway), else LLMFLEET_LOG_LEVEL, else info
        level = resolve_level(getattr(args, "log_level", None))
    except ValueError as exc:
        eprint(f"llmfleet {args.command}: {exc}")
        return EXIT_USAGE
    setup_logging(level=level)  # JSON lines on stderr; `serve` switches to its buffered writer
    try:
        code: int = args.run(args)
    except LlmfleetError as exc:
        eprint(f"llmfleet {args.command}: {exc}")
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `llmfleet render x | head`
        return EXIT_OK
    return code
