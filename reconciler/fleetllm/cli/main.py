"""`fleetllm`: the command line. Each subcommand lives in fleetllm/cli/<module>.py and exposes
`register(subparsers)`, which adds its parser (or parsers) and sets `run(args) -> exit code`.

COMMANDS below is the table of every command: its name, the module that implements it and its one-line
help (written here only: `register` passes none). Only the invoked command's module is imported and
registered; every other command gets a placeholder parser with its help, so `fleetllm --help` still
lists them all while `fleetllm --version` or `fleetllm validate` imports nothing it does not run (no
web server, database driver, HTTP client or terminal library). `build_parser(full=True)` registers
every module (shell completion, the docs' checks).

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
from dataclasses import dataclass
from typing import Any

from fleetllm.cli.common import EXIT_OK, EXIT_USAGE, CommandError, eprint
from fleetllm.errors import EXIT_INVALID, FleetllmError
from fleetllm.logs import resolve_level, setup_logging


@dataclass(frozen=True)
class Command:
    name: str
    module: str  # fleetllm.cli.<module>: its register() adds this command's parser
    help: str
    aliases: tuple[str, ...] = ()


# Every command, in the order `fleetllm --help` lists them. A module with several commands (control) has
# them next to each other, in the order its register() adds them.
COMMANDS: tuple[Command, ...] = (
    Command("validate", "validate", "check a fleet repository (YAML, schema and semantic rules)"),
    Command("render", "render", "print the box JSON for one box"),
    Command("api-key", "api_key", "print the vLLM bearer of one server"),
    Command("show", "show", "print the placement as a table (or JSON)"),
    Command("diff", "diff", "report what a fleet change will do (for reviews and PR comments)"),
    Command("gateway", "gateway", "run the box gateway (one port, many models; LLMhop-compatible)"),
    Command("serve", "serve", "run the control plane (GET /vllm/config and friends)"),
    Command("approve", "approve", "add a box with its models to the placement, as a git commit"),
    Command("import", "import_llmao", "import another control plane's fleet (llmao) into a fleet repository"),
    Command("plan", "plan", "show what the reconciler would change in LiteLLM"),
    Command("apply", "apply", "run one reconcile pass: converge LiteLLM's deployments"),
    Command("reconcile", "reconcile", "run reconcile passes on a schedule (or --once)"),
    Command("sync", "control", "ask for a reconcile pass now (and re-read the tracked branch)"),
    Command("suspend", "control", "suspend the fleet: passes observe and record, and change nothing"),
    Command("resume", "control", "end a suspension"),
    Command("pin", "control", "serve one valid revision of the tracked branch to every box, until unpinned"),
    Command("unpin", "control", "remove the pin: boxes get the newest valid revision again"),
    Command("control", "control", "show the fleet's controls in force (suspension, pin, sync) and their audit trail"),
    Command("rollout", "rollout", "show, pause, resume, abort or wait for the staged rollout"),
    Command("demo", "demo", "run a whole simulated fleet on this machine"),
    Command("completion", "completion", "print a shell completion script (bash, zsh, fish)"),
)
BY_NAME = {name: command for command in COMMANDS for name in (command.name, *command.aliases)}
# A pass that could not run (the config, the repository, the state store, no valid commit, a stale or
# unreadable plan file, a render error) exits 1, as these commands' help says; 2 is their usage only.
PASS_COMMANDS = frozenset({"plan", "apply", "reconcile"})


class Parser(argparse.ArgumentParser):
    """argparse without prefix matching: an abbreviated option is an error, not a guess."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)


class _Registrar:
    """What a module's register() is given as `subparsers`: add_parser() for its own commands, each with
    the help and aliases of COMMANDS."""

    def __init__(self, subparsers: Any, module: str) -> None:
        self._subparsers = subparsers
        self._module = module
        self.added: list[str] = []

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        command = BY_NAME.get(name)
        if command is None or command.module != self._module:
            raise ValueError(f"fleetllm.cli.{self._module} adds a command {name!r} that COMMANDS in "
                             "fleetllm.cli.main does not give to it: add it to the table")
        if "help" in kwargs or "aliases" in kwargs:
            raise ValueError(f"fleetllm.cli.{self._module}: the help and aliases of {name!r} are COMMANDS' "
                             "(fleetllm.cli.main), not register()'s")
        self.added.append(name)
        parser: argparse.ArgumentParser = self._subparsers.add_parser(name, help=command.help,
                                                                      aliases=list(command.aliases), **kwargs)
        return parser


def invoked(argv: Sequence[str]) -> str | None:
    """The command `argv` names: its first word that is not an option (the top-level parser has only
    --help and --version, which take no value)."""
    for i, word in enumerate(argv):
        if word == "--":
            return argv[i + 1] if i + 1 < len(argv) else None
        if not word.startswith("-"):
            return word
    return None


def build_parser(command: str | None = None, *, full: bool = False) -> argparse.ArgumentParser:
    """The parser with `command`'s module registered (every module when `full`) and a placeholder with
    the help of each other command."""
    from fleetllm import __version__

    parser = Parser(prog="fleetllm", description="Run a self-hosted vLLM fleet from git.")
    parser.add_argument("--version", action="version", version=f"fleetllm {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    wanted = BY_NAME[command].module if command in BY_NAME else None
    registered: set[str] = set()
    for entry in COMMANDS:
        if entry.module in registered:
            continue
        if full or entry.module == wanted:
            registrar = _Registrar(subparsers, entry.module)
            importlib.import_module(f"fleetllm.cli.{entry.module}").register(registrar)
            expected = [c.name for c in COMMANDS if c.module == entry.module]
            if registrar.added != expected:
                raise ValueError(f"fleetllm.cli.{entry.module} registered {registrar.added}, COMMANDS lists "
                                 f"{expected}, in that order")
            registered.add(entry.module)
        else:
            subparsers.add_parser(entry.name, help=entry.help, aliases=list(entry.aliases), add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(invoked(argv))
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    args.command = BY_NAME[args.command].name  # an alias runs as its command
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
