"""tools/mutation.py (make mutation): which modules a change selects, and the per-module mutmut config it
writes into its scratch copy (the project tree is never touched). mutmut itself is not run here."""

from __future__ import annotations

import importlib.util
import sys
import tomllib
from pathlib import Path
from types import ModuleType

from tests.conftest import ROOT


def tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mutation_tool", ROOT / "tools" / "mutation.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["mutation_tool"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_every_module_names_existing_sources_and_tests() -> None:
    for module in tool().MODULES:
        for path in (*module.sources, *module.tests):
            assert (ROOT / path).is_file(), path


def test_a_change_selects_its_modules() -> None:
    mutation = tool()
    names = [m.name for m in mutation.changed_modules({"reconciler/fleetllm/core/judge/plan.py", "docs/testing.md"})]
    assert names == ["plan"]
    assert mutation.changed_modules({"reconciler/fleetllm/cli/main.py"}) == []
    assert mutation.changed_files("no-such-ref-anywhere") is None
    assert {m.name for m in mutation.MODULES if m.in_ci} == {"bearer", "render", "verdict", "plan"}


def test_the_scratch_copy_gets_the_module_config(tmp_path: Path) -> None:
    mutation = tool()
    plan = next(m for m in mutation.MODULES if m.name == "plan")
    mutation.scratch_copy(plan, tmp_path)
    config = tomllib.loads((tmp_path / "pyproject.toml").read_text())["tool"]["mutmut"]
    # mutmut names a mutant by its path under src/, which must be its import name (fleetllm.core...).
    assert config["only_mutate"] == [mutation.in_scratch(s) for s in plan.sources] == [
        "src/fleetllm/core/judge/plan.py"]
    assert config["pytest_add_cli_args_test_selection"] == list(plan.tests)
    assert config["source_paths"] == ["src/"]
    assert (tmp_path / "src" / "fleetllm" / "core" / "judge" / "plan.py").read_text() == (
        ROOT / "reconciler" / "fleetllm" / "core" / "judge" / "plan.py").read_text()
