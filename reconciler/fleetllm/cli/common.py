"""Helpers shared by subcommands: loading a fleet from a directory or a commit, finding the control plane's
config file, reporting errors.

Light on purpose: every command imports it, so what only some commands run (the git adapter, the
validator) is imported where it is used."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetllm.errors import EXIT_INVALID, EXIT_USAGE, ConfigurationError, FleetllmError, SourceError
from fleetllm.logs import get_logger, log_event

if TYPE_CHECKING:
    from fleetllm.core.fleet.validate import Validation

__all__ = ["CONFIG_ENV", "CONFIG_SEARCH", "EXIT_INVALID", "EXIT_OK", "EXIT_USAGE", "CommandError", "add_repo_arguments",
           "config_candidates", "eprint", "find_config", "load_validation", "require_valid"]

EXIT_OK = 0
CONFIG_ENV = "FLEETLLM_CONFIG"
# Where a command looks for the control plane's config file when --config is not given (find_config), in
# words for --help and errors.
CONFIG_SEARCH = (f"${CONFIG_ENV}, else the first file found of ./fleetllm.yaml, "
                 "$XDG_CONFIG_HOME/fleetllm/config.yaml (~/.config/fleetllm/config.yaml) and /etc/fleetllm/config.yaml")
SYSTEM_CONFIG = Path("/etc/fleetllm/config.yaml")


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
    from fleetllm.adapters.git import read_fleet
    from fleetllm.core.fleet.validate import validate_snapshot

    try:
        snapshot = read_fleet(repo, rev)
    except SourceError as exc:
        raise CommandError(str(exc)) from None
    return validate_snapshot(snapshot)


def eprint(*parts: Any) -> None:
    print(*parts, file=sys.stderr)


def require_valid(validation: Validation) -> None:
    from fleetllm.core.fleet.diagnostics import format_text

    if validation.fleet is None:
        eprint(format_text(validation.diagnostics))
        raise CommandError(f"the fleet at {validation.revision} is not valid; run `fleetllm validate`",
                           EXIT_INVALID)


def config_candidates(env: Mapping[str, str], cwd: Path | None = None) -> list[tuple[Path, str]]:
    """The default places of the config file, in the order they are tried, each with how it is named."""
    found = [((cwd or Path.cwd()) / "fleetllm.yaml", "./fleetllm.yaml in the current directory")]
    xdg = env.get("XDG_CONFIG_HOME", "")
    if os.path.isabs(xdg):  # the XDG base directory spec: a relative or empty value is ignored
        found.append((Path(xdg) / "fleetllm" / "config.yaml", "$XDG_CONFIG_HOME/fleetllm/config.yaml"))
    else:
        home = env.get("HOME", "")
        if not os.path.isabs(home):
            try:
                home = str(Path.home())
            except (RuntimeError, KeyError):  # no home directory at all (a bare service account)
                home = ""
        if home:
            found.append((Path(home) / ".config" / "fleetllm" / "config.yaml", "~/.config/fleetllm/config.yaml"))
    found.append((SYSTEM_CONFIG, str(SYSTEM_CONFIG)))
    return found


def find_config(given: str | None, env: Mapping[str, str] | None = None, *, cwd: Path | None = None) -> str | None:
    """The control plane's config file a command reads: `--config` when given; else the file ${CONFIG_ENV}
    names (an error when there is none); else the first that exists of ./fleetllm.yaml,
    $XDG_CONFIG_HOME/fleetllm/config.yaml (~/.config/fleetllm/config.yaml when it is not set) and
    /etc/fleetllm/config.yaml; else None (the command's own fallback: the environment alone for `plan`,
    `apply` and `reconcile`). The log says which file was taken and why (info; debug for --config)."""
    log = get_logger("config")
    if given:
        log_event(log, "config file", logging.DEBUG, path=given, found_by="--config")
        return given
    env = os.environ if env is None else env
    named = env.get(CONFIG_ENV, "")
    if named:
        if not Path(named).is_file():
            raise ConfigurationError(f"{CONFIG_ENV}={named}: no such file; point {CONFIG_ENV} at the control plane's "
                                     f"config file, unset it, or pass --config FILE")
        log_event(log, "config file", path=named, found_by=f"${CONFIG_ENV}")
        return named
    for path, how in config_candidates(env, cwd):
        if path.is_file():
            log_event(log, "config file", path=str(path), found_by=how)
            return str(path)
    log_event(log, "no config file", logging.DEBUG, looked_at=[str(p) for p, _ in config_candidates(env, cwd)])
    return None
