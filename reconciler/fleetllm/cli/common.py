"""Helpers shared by subcommands: loading a fleet from a directory or a commit, reporting errors."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from fleetllm.adapters.git import read_fleet
from fleetllm.core.fleet.diagnostics import format_text
from fleetllm.core.fleet.validate import Validation, validate_snapshot
from fleetllm.errors import EXIT_INVALID, EXIT_USAGE, FleetllmError, SourceError

__all__ = ["EXIT_INVALID", "EXIT_OK", "EXIT_USAGE", "CommandError", "add_repo_arguments", "eprint", "load_validation",
           "require_valid"]

EXIT_OK = 0


class CommandError(FleetllmError):
    """A usage or I/O problem of one command: exit 2 unless `code` says otherwise."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.exit_code = code

    @property
    def code(self) -> int:
        return self.exit_code


def add_repo_arguments(parser: argparse.ArgumentParser, *, positional: bool = False) -> None:
    if positional:
        parser.add_argument("repo", nargs="?", default=".", metavar="DIR",
                            help="the fleet repository (default: the current directory)")
    else:
        parser.add_argument("--repo", default=".", metavar="DIR",
                            help="the fleet repository (default: the current directory)")
    parser.add_argument("--rev", metavar="REV",
                        help="read the files of this git commit instead of the working tree "
                             "(a bare repository has none: its HEAD is read)")


def load_validation(repo: str, rev: str | None) -> Validation:
    try:
        snapshot = read_fleet(repo, rev)
    except SourceError as exc:
        raise CommandError(str(exc)) from None
    return validate_snapshot(snapshot)


def eprint(*parts: Any) -> None:
    print(*parts, file=sys.stderr)


def require_valid(validation: Validation) -> None:
    if validation.fleet is None:
        eprint(format_text(validation.diagnostics))
        raise CommandError(f"the fleet at {validation.revision} is not valid; run `fleetllm validate`",
                           EXIT_INVALID)
