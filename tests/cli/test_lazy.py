"""The command line imports only what the invoked command runs (fleetllm.cli.main): `--version` and
`--help` load no command module and nothing heavy, `validate` neither the web server, the database
driver, the HTTP clients nor the terminal library; `--help` still lists every command. Each case runs in
a fresh interpreter, where sys.modules tells what the command imported (correctness, not a duration)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fleetllm.cli.main import BY_NAME, COMMANDS, build_parser, invoked
from tests.conftest import EXAMPLE, ROOT

# What no command but the one that runs it may import.
SERVER_SIDE = ("aiohttp", "psycopg", "psycopg_pool", "flask", "werkzeug", "tornado", "prometheus_client", "authlib",
               "joserfc", "requests", "supervisor", "gunicorn", "uvloop", "apprise")
HEAVY = (*SERVER_SIDE, "rich", "ruamel", "git", "shtab")  # git: GitPython
VALIDATION = ("jsonschema", "yaml")

PROBE = """
import json, sys
from fleetllm.cli.main import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
print(json.dumps({"code": code, "modules": sorted(sys.modules)}), file=sys.stderr)
"""


def imported(*argv: str, cwd: Path = ROOT) -> tuple[int, set[str], str]:
    """Run `fleetllm ARGV` in a fresh interpreter: its exit status, the modules it imported, its stdout."""
    done = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=120,
                          cwd=cwd, check=False)
    report = json.loads(done.stderr.strip().splitlines()[-1])
    return report["code"], set(report["modules"]), done.stdout


def loaded(modules: set[str], *roots: str) -> list[str]:
    return sorted(m for m in modules if m.split(".")[0] in roots)


def command_modules(modules: set[str]) -> set[str]:
    return {m.rsplit(".", 1)[1] for m in modules if m.startswith("fleetllm.cli.")} - {"main", "common"}


def test_version_imports_no_command_and_nothing_heavy() -> None:
    code, modules, out = imported("--version")
    assert code == 0 and out.startswith("fleetllm ")
    assert loaded(modules, *HEAVY, *VALIDATION) == []
    assert command_modules(modules) == set()
    assert not any(m.startswith(("fleetllm.settings", "fleetllm.job", "fleetllm.server", "fleetllm.adapters"))
                   for m in modules)


def test_help_lists_every_command_without_importing_one() -> None:
    code, modules, out = imported("--help")
    assert code == 0
    for command in COMMANDS:
        assert command.name in out and command.help in " ".join(out.split()), command.name
    assert command_modules(modules) == set()
    assert loaded(modules, *HEAVY, *VALIDATION) == []


def test_validate_imports_only_what_validation_runs(fleet_dir: Path) -> None:
    code, modules, out = imported("validate", "--help")
    assert code == 0 and "--format" in out
    assert command_modules(modules) == {"validate"}
    assert loaded(modules, *HEAVY) == []
    code, modules, out = imported("validate", str(fleet_dir))
    assert code == 0 and "valid at working-tree" in out
    assert command_modules(modules) == {"validate"}
    assert loaded(modules, *HEAVY) == []
    assert {"jsonschema", "yaml"} <= modules  # it did validate


@pytest.mark.parametrize("name", [c.name for c in COMMANDS])
def test_each_commands_help_imports_its_module_only_and_no_server_side_library(name: str) -> None:
    code, modules, out = imported(name, "--help")
    assert code == 0 and f"usage: fleetllm {name}" in out
    # plan, apply and reconcile share passes; sync (with --wait) and rollout (wait) share waiting
    assert command_modules(modules) <= {BY_NAME[name].module, "passes", "waiting"}
    assert BY_NAME[name].module in command_modules(modules)
    assert loaded(modules, *SERVER_SIDE) == [], name


def test_the_lazy_parser_of_a_command_is_its_full_parser() -> None:
    full = subparsers(build_parser(full=True))
    assert list(full) == [c.name for c in COMMANDS]
    for command in COMMANDS:
        lazy = subparsers(build_parser(command.name))
        assert list(lazy) == list(full)  # --help and "invalid choice" still name every command
        assert options(lazy[command.name]) == options(full[command.name]), command.name
        others = [c for c in COMMANDS if c.module != command.module]
        assert all(options(lazy[c.name]) == [] for c in others)  # placeholders


def test_the_command_is_found_before_parsing() -> None:
    assert invoked(["validate", "--format", "json", "."]) == "validate"
    assert invoked(["--version"]) is None
    assert invoked(["-h", "plan", "--config", "x"]) == "plan"
    assert invoked(["--", "show"]) == "show"
    assert invoked([]) is None


def test_an_unknown_command_is_refused_with_every_name(capsys: pytest.CaptureFixture[str]) -> None:
    from fleetllm.cli.main import main

    with pytest.raises(SystemExit) as exited:
        main(["valdate", str(EXAMPLE)])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'valdate'" in err and "'completion'" in err and "'serve'" in err


def test_a_module_cannot_register_what_the_table_does_not_give_it() -> None:
    import argparse

    from fleetllm.cli.main import Parser, _Registrar

    registrar = _Registrar(Parser(prog="x").add_subparsers(parser_class=Parser), "validate")
    with pytest.raises(ValueError, match="COMMANDS"):
        registrar.add_parser("render")
    with pytest.raises(ValueError, match="help and aliases"):
        registrar.add_parser("validate", help="another line")
    assert isinstance(registrar.add_parser("validate"), argparse.ArgumentParser)


def subparsers(parser: object) -> dict[str, object]:
    import argparse

    assert isinstance(parser, argparse.ArgumentParser)
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def options(parser: object) -> list[str]:
    import argparse

    assert isinstance(parser, argparse.ArgumentParser)
    return [s for a in parser._actions for s in (a.option_strings or [a.dest])]
