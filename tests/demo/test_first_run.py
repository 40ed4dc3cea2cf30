"""A newcomer's first run of the demo, without what it needs: a message that says what to install or pass,
never a traceback; and where the demo says its config is."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from fleetllm.cli.main import main
from fleetllm.demo.fleet import DemoError
from fleetllm.demo.guide import where_to_look
from fleetllm.demo.litellm import Litellm
from fleetllm.demo.run import NO_HARNESS, Demo, Options
from fleetllm.demo.workspace import create
from tests.conftest import EXAMPLE, ROOT


def test_demo_without_supervisor_says_what_to_install(monkeypatch: pytest.MonkeyPatch,
                                                      capfd: pytest.CaptureFixture[str]) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        return None if name == "supervisor" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    assert main(["demo", "--once"]) == 1
    err = capfd.readouterr().err
    assert "Traceback" not in err
    assert err.startswith("fleetllm demo: fleetllm demo runs a real supervisord per simulated box, and the "
                          "supervisor package is not installed beside fleetllm: pip install 'supervisor>=4.2'")


def test_supervisor_is_a_dependency_of_fleetllm() -> None:
    # `pip install fleetllm` then `fleetllm demo` must work: supervisor comes with fleetllm itself.
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert any(d.startswith("supervisor>=") for d in project["dependencies"])


def test_demo_litellm_without_a_harness_says_where_to_get_it(capsys: pytest.CaptureFixture[str],
                                                             tmp_path: Path) -> None:
    demo = Demo(Options(example=EXAMPLE, build_litellm=True, litellm_harness=None), console=_console())
    with pytest.raises(DemoError) as info:
        demo._litellm(create(tmp_path / "w"), [])
    assert str(info.value) == NO_HARNESS
    assert "--litellm-harness DIR" in NO_HARNESS and "shared/litellm-offline" in NO_HARNESS
    assert "--litellm-url URL" in NO_HARNESS


@pytest.mark.parametrize("with_litellm", [False, True])
def test_the_demo_prints_its_config_and_the_plan_command(tmp_path: Path, with_litellm: bool) -> None:
    workspace = create(tmp_path / "w")
    litellm = Litellm("http://127.0.0.1:4000", "sk-x") if with_litellm else None
    lines = "\n".join(where_to_look(workspace, "http://127.0.0.1:9", litellm, "m"))
    assert f"  config           {workspace.config}" in lines
    assert f"plan --config {workspace.config}" in lines
    assert f"sync|suspend|resume|pin REV|unpin|control --url http://127.0.0.1:9 --token-file " \
           f"{workspace.secret_file('admin-token')}" in lines  # the fleet controls, with the demo's admin token
    assert "sk-x" not in lines


def _console() -> Any:
    from rich.console import Console

    return Console(quiet=True)
