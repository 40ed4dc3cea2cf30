"""Supervisor program files, parsed back by Supervisor 4.3's own config parser."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from supervisor.datatypes import RestartUnconditionally
from supervisor.options import ServerOptions, UnhosedConfigParser

from fleetllm_installer.boxjson import parse_box
from fleetllm_installer.fit import Placement
from fleetllm_installer.settings import load
from fleetllm_installer.units import UnitError, command_line, environment_line, quote_token, render_unit
from tests.installer.conftest import BOX


def parse_program(path: Path) -> Any:
    """The ProcessConfig supervisord builds from a program file, as it reads included files."""
    parser = UnhosedConfigParser()
    assert parser.read([str(path)]) == [str(path)]
    (section,) = [s for s in parser.sections() if s.startswith("program:")]
    (config,) = ServerOptions().processes_from_section(parser, section, section.split(":", 1)[1])
    return config


def roundtrip(tmp_path: Path, argv: list[str], env: dict[str, str] | None = None) -> Any:
    path = tmp_path / "p.conf"
    text = f"[program:p]\ncommand={command_line(argv)}\n"
    if env:
        text += f"environment={environment_line(env)}\n"
    path.write_text(text, encoding="ascii")
    return parse_program(path)


TRAPS = ["a #b", "a ;b", "x%y", "%(ENV_HOME)s", "{\"image\": 4}", "it's", 'say "hi"', " lead", "trail ",
         "", "back\\slash", "$HOME", "`cmd`", "a=b,c", "#start", ";start", "  ", "tab-free\\t", "*?[]"]


@pytest.mark.parametrize("token", TRAPS)
def test_supervisor_traps_round_trip(tmp_path: Path, token: str) -> None:
    argv = ["/usr/bin/vllm", "serve", token, "--last"]
    assert shlex.split(roundtrip(tmp_path, argv).command) == argv


@given(st.lists(st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=12), min_size=1,
                max_size=5))
def test_any_printable_ascii_argument_round_trips(tmp_path_factory: pytest.TempPathFactory, argv: list[str]) -> None:
    directory = tmp_path_factory.mktemp("rt")
    assert shlex.split(roundtrip(directory, ["/bin/x", *argv]).command) == ["/bin/x", *argv]


@pytest.mark.parametrize("token", ["new\nline", "nul\0", "tab\there", "caf\u00e9"])
def test_unwritable_arguments_are_refused(token: str) -> None:
    with pytest.raises(UnitError):
        quote_token(token)


def test_environment_round_trips(tmp_path: Path) -> None:
    env = {"VLLM_API_KEY": "sk-vllm-AbC_12-x", "HF_HOME": "/workspace/hf-cache", "LIST": "a,b=c", "EMPTY": ""}
    assert roundtrip(tmp_path, ["/bin/x"], env).environment == env


@pytest.mark.parametrize("value", ['a"b', "a b", "x #y", "a;b", "100%", "it's"])
def test_environment_values_outside_the_alphabet_are_refused(value: str) -> None:
    with pytest.raises(UnitError, match="outside A-Z"):
        environment_line({"X": value})


def test_bearer_value_is_not_shown_in_the_error() -> None:
    with pytest.raises(UnitError) as caught:
        environment_line({"VLLM_API_KEY": "secret value"})
    assert "secret" not in str(caught.value)


def test_rendered_unit_parses_with_every_setting(tmp_path: Path, box_json: dict[str, Any]) -> None:
    settings = load({"FLEETLLM_DATA_DIR": str(tmp_path / "data"), "FLEETLLM_SUPERVISOR_CONF_DIR": str(tmp_path)},
                    need_control_plane=False)
    box = parse_box(box_json, BOX)
    small = next(s for s in box.servers if s.name == "small")
    ports = {s.name: s.port for s in box.servers}
    unit = render_unit(small, Placement(gpus=(0, 1), gpu_memory_utilization=0.42, after=("large",)),
                       ports=ports, settings=settings, python="/usr/bin/python3", revision="abc123", gpu_count=2)
    unit.path.write_text(unit.text)
    settings.log_dir.mkdir(parents=True)  # supervisord refuses a log file in a missing directory
    config = parse_program(unit.path)
    argv = shlex.split(config.command)
    vllm = argv[argv.index("--") + 1:]
    assert argv[:2] == ["/usr/bin/python3", str(tmp_path / "data/fleetllm/bin/fleetllm-launch")]
    assert argv[argv.index("--after") + 1] == f"large={ports['large']}"
    assert vllm == ["vllm", "serve", "org/small-model", "--host", "0.0.0.0", "--port", str(small.port),  # noqa: S104
                    "--served-model-name", "small", "--max-model-len", "4096", "--gpu-memory-utilization", "0.42",
                    "--enable-prefix-caching", "--limit-mm-per-prompt", '{"image": 4}']
    assert small.api_key not in config.command
    assert config.environment["VLLM_API_KEY"] == small.api_key
    assert config.environment["HF_HOME"] == str(tmp_path / "data/hf-cache")
    assert config.environment["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert config.environment["FLEETLLM_DIGEST"] == small.digest
    assert config.environment["FLEET_KEY"] == ""  # blanked: supervisord may have inherited it
    assert config.environment["FLEETLLM_FLEET_KEY"] == ""
    assert config.stopasgroup
    assert config.killasgroup
    assert config.stopwaitsecs >= 30
    assert config.startsecs == 60
    assert config.autorestart is RestartUnconditionally
    assert config.redirect_stderr
    assert config.stdout_logfile == str(tmp_path / "data/fleetllm/logs/small.log")
    assert config.stdout_logfile_maxbytes == 50 * 1024 * 1024
    assert config.stdout_logfile_backups == 5
    assert config.priority == 100  # the same for every server: see test_agent.py
    assert small.api_key not in unit.shown
    assert "VLLM_API_KEY=\"<redacted sha256:" in unit.shown


def test_single_gpu_box_sets_no_cuda_visible_devices(tmp_path: Path, box_json: dict[str, Any]) -> None:
    settings = load({"FLEETLLM_DATA_DIR": str(tmp_path)}, need_control_plane=False)
    server = parse_box(box_json, BOX).servers[0]
    unit = render_unit(server, Placement((0,), None, ()), ports={}, settings=settings,
                       python="python3", revision="r", gpu_count=1)
    assert "CUDA_VISIBLE_DEVICES" not in unit.text
    assert "--gpu-memory-utilization" not in unit.text
    assert "--after" not in unit.text
