"""The box program's logging entry point, shared by its commands (the installer, the box agent).

    parser = argparse.ArgumentParser(...); logs.add_arguments(parser)
    args = parser.parse_args(argv); logs.setup(args, "fleetllm-installer")   # ValueError: a bad level
    logs.log("wrote 3 program(s)", programs=3)

Lines are the one fleetllm format (fleetllm_contract.logfmt: JSON with ts, level, logger, event and
fields) on stderr, which is what Supervisor and the provisioning scripts keep. `--log-format text`
(the default only when stderr is a terminal) writes `prog: message` for a person running it by hand.
The level is `--log-level`, else FLEETLLM_LOG_LEVEL, else info. Standard library only.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import IO, Any

from fleetllm_contract.logfmt import FORMATS, add_level_argument, configure, resolve_level

LOGGER = "fleetllm.installer"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_level_argument(parser)
    parser.add_argument("--log-format", choices=FORMATS,
                        help="json: one JSON object a line (the default unless stderr is a terminal, so what "
                             "Supervisor and provisioning keep); text: readable lines (the default on a terminal)")


def setup(args: argparse.Namespace, prog: str, logger: str = LOGGER, stream: IO[str] | None = None) -> logging.Logger:
    """Configure the logger named `logger` from the parsed arguments; raises ValueError for a bad level."""
    target = stream or sys.stderr
    fmt = getattr(args, "log_format", None) or ("text" if _is_terminal(target) else "json")
    chosen = logging.getLogger(logger)
    configure(chosen, resolve_level(getattr(args, "log_level", None)), fmt=fmt, prog=prog, stream=stream)
    chosen.propagate = False
    return chosen


def _is_terminal(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def log(message: str, level: int = logging.INFO, logger: str = LOGGER, **fields: Any) -> None:
    """One line: `message` is the event, `fields` follow it (never a secret)."""
    logging.getLogger(logger).log(level, message, extra={"fields": fields})
