"""`fleetllm`: the command line. Each subcommand lives in fleetllm/cli/<name>.py and exposes
`register(subparsers)`, which adds its parser and sets `run(args) -> exit code`.

Errors are mapped to exit codes here, once: a FleetllmError (fleetllm.errors) prints
`fleetllm COMMAND: message` on stderr and exits with its `exit_code`, except that the pass commands
(PASS_COMMANDS) exit 1 for any error of the tree that is not a usage error of their own (CommandError);
nothing else is caught, so a bug still shows its traceback. Options are never taken by an abbreviation
(`--conf` is not `--config`)."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Any

from fleetllm import __version__
from fleetllm.cli.common import EXIT_OK, EXIT_USAGE, CommandError, eprint
from fleetllm.errors import EXIT_INVALID, FleetllmError
from fleetllm.logs import resolve_level, setup_logging

# Subcommand modules, in the order `fleetllm --help` lists them.
COMMANDS = ("validate", "render", "api_key", "show", "diff", "gateway", "serve", "approve", "import_llmao", "plan",
            "apply", "reconcile", "control", "rollout", "demo")
# A pass that could not run (the config, the repository, the state store, no valid commit, a stale or
# unreadable plan file, a render error) exits 1, as these commands' help says; 2 is their usage only.
PASS_COMMANDS = frozenset({"plan", "apply", "reconcile"})


class Parser(argparse.ArgumentParser):
    """argparse without prefix matching: an abbreviated option is an error, not a guess."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="fleetllm", description="Run a self-hosted vLLM fleet from git.")
    parser.add_argument("--version", action="version", version=f"fleetllm {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for name in COMMANDS:
        importlib.import_module(f"fleetllm.cli.{name}").register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:  # `--log-level` (serve, reconcile, gateway), else FLEETLLM_LOG_LEVEL, else info
        level = resolve_level(getattr(args, "log_level", None))
    except ValueError as exc:
        eprint(f"fleetllm {args.command}: {exc}")
        return EXIT_USAGE
    setup_logging(level=level)  # JSON lines on stderr; `serve` switches to its buffered writer
    try:
        code: int = args.run(args)
    except FleetllmError as exc:
        eprint(f"fleetllm {args.command}: {exc}")
        return exit_code(args.command, exc)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `fleetllm render x | head`
        return EXIT_OK
    return code


def exit_code(command: str, exc: FleetllmError) -> int:
    """The exit status for an error of the tree: its own, or 1 from a pass command (PASS_COMMANDS)."""
    if command in PASS_COMMANDS and not isinstance(exc, CommandError):
        return EXIT_INVALID
    return exc.exit_code
