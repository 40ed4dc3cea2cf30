"""fleet.yaml's defaults are written once, in schemas/fleet.schema.json (issue 24, item C): the fleet
model, the rollout, the judge and the observer read theirs from it (fleetllm.core.fleet.model.DEFAULTS).
These tests compare every default the code uses with the schema's, and fail on a literal default written
for a fleet.yaml setting anywhere in the control plane's code."""

from __future__ import annotations

import ast
import dataclasses
import json
from collections.abc import Iterator
from typing import Any

import pytest

from fleetllm.core.fleet import model
from fleetllm.core.fleet.model import CapacitySettings, FleetSettings, ReconcileSettings, RolloutSettings
from fleetllm.core.judge.intended import IntendedServer
from fleetllm.core.rollout import step
from fleetllm.core.rollout.model import ServerSpec, StepInput
from fleetllm.job.observer import Observer
from tests.conftest import ROOT

CODE = ROOT / "reconciler" / "fleetllm"
# A name of a fleet.yaml setting given to something else (file: what), with what it is instead.
OTHER_MEANINGS = {
    "demo/procs.py: wait_until(interval_s=...)": "how often the demo polls for a condition",
    "demo/run.py: Options.interval_s": "the demo's own pause between passes",
}


def schema_file_defaults() -> dict[str, Any]:
    """Every `default` of schemas/fleet.schema.json by JSON pointer, read here from the file (not through
    the code under test)."""
    found: dict[str, Any] = {}

    def walk(node: dict[str, Any], where: str) -> None:
        for key, sub in node.get("properties", {}).items():
            if "default" in sub:
                found[f"{where}/{key}"] = sub["default"]
            walk(sub, f"{where}/{key}")

    walk(json.loads((ROOT / "schemas" / "fleet.schema.json").read_text(encoding="utf-8")), "")
    return found


SCHEMA = schema_file_defaults()
# Fields of the model that hold no fleet.yaml default of their own (sections, and a list without one).
NO_DEFAULT = {"FleetSettings.legacy_servers", "FleetSettings.reconcile", "FleetSettings.rollout",
              "FleetSettings.capacity", "CapacitySettings.pools",
              "FleetSettings.fleet_id"}  # fleet_id has none: a new fleet must name itself
# Other names the code gives a fleet.yaml setting.
ALIASES = {"grace_s": "/reconcile/health_grace_s"}
SETTING_NAMES = {pointer.rsplit("/", 1)[1] for pointer in SCHEMA} | set(ALIASES)


def plain(value: Any) -> Any:
    """A default as the schema writes it (a tuple as a list, an enum member as its value)."""
    if isinstance(value, tuple):
        return [plain(v) for v in value]
    return getattr(value, "value", value)


def model_defaults() -> Iterator[tuple[str, str, Any]]:
    """(the field, the schema pointer it stands for, its default) of every defaulted field of the model."""
    for cls, section in ((ReconcileSettings, "/reconcile"), (RolloutSettings, "/rollout"), (FleetSettings, ""),
                         (CapacitySettings, "/capacity")):
        instance = CapacitySettings(1.0) if cls is CapacitySettings else cls()  # its ceiling has no default
        for f in dataclasses.fields(cls):
            name = f"{cls.__name__}.{f.name}"
            required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            if name not in NO_DEFAULT and not required:
                yield name, f"{section}/{f.name}", getattr(instance, f.name)


def other_defaults() -> Iterator[tuple[str, str, Any]]:
    """The defaults outside the model's settings classes that stand for a fleet.yaml setting."""
    spec = ServerSpec("m", "m", 8001, "sha256:x", "d")
    inp = StepInput("r", 0.0, {}, {}, None, {}, None)
    server = next(f for f in dataclasses.fields(IntendedServer) if f.name == "health_grace_s")
    yield "core.fleet.model.DEFAULT_LISTEN_PORTS", "/listen_ports", model.DEFAULT_LISTEN_PORTS
    yield "core.fleet.model.DEFAULT_MAX_SERVERS", "/max_servers_per_box", model.DEFAULT_MAX_SERVERS
    yield "core.rollout.model.ServerSpec.grace_s", "/reconcile/health_grace_s", spec.grace_s
    yield "core.rollout.model.StepInput.drain_s", "/rollout/drain_s", inp.drain_s
    yield "core.rollout.model.StepInput.budget (a model without one)", "/rollout/max_unavailable", inp.budget("m")
    yield "core.rollout.step.DEFAULT_GRACE_S", "/reconcile/health_grace_s", step.DEFAULT_GRACE_S
    yield "core.judge.intended.IntendedServer.health_grace_s", "/reconcile/health_grace_s", server.default
    observer = Observer({})
    yield "job.observer.Observer.probe_timeout_s", "/reconcile/probe_timeout_s", observer.probe_timeout_s
    yield "job.observer.Observer.probe_concurrency", "/reconcile/probe_concurrency", observer.probe_concurrency


USED = [*model_defaults(), *other_defaults()]


@pytest.mark.parametrize(("name", "pointer", "value"), USED, ids=[name for name, _, _ in USED])
def test_every_default_the_code_uses_is_the_schemas(name: str, pointer: str, value: Any) -> None:
    assert pointer in SCHEMA, f"{name}: schemas/fleet.schema.json declares no default at {pointer}: write it there"
    written = SCHEMA[pointer]
    assert plain(value) == written and isinstance(plain(value), bool) == isinstance(written, bool), \
        f"{name} defaults to {value!r}, the schema to {written!r} at {pointer}: read the schema's"


def test_every_schema_default_reaches_the_model() -> None:
    used = {pointer for _, pointer, _ in model_defaults()}
    assert set(SCHEMA) <= used, f"schema defaults no field of the model reads: {sorted(set(SCHEMA) - used)}"


def _literal(node: ast.expr | None) -> bool:
    """A value written in the code: a constant, a negated one, or a tuple/list/set of them."""
    if isinstance(node, ast.Constant):
        return node.value is not None
    if isinstance(node, ast.UnaryOp):
        return _literal(node.operand)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return bool(node.elts) and all(_literal(e) for e in node.elts)
    return False


def literal_defaults(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, name) of each literal default given to a fleet.yaml setting's name: a field of a class,
    a parameter, or the second argument of `.get("<setting>", ...)`."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
                        and item.target.id in SETTING_NAMES and _literal(item.value)):
                    yield item.lineno, f"{node.name}.{item.target.id}"
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            positional = [*node.args.posonlyargs, *node.args.args]
            pairs = [*zip(positional[len(positional) - len(node.args.defaults):], node.args.defaults, strict=True),
                     *zip(node.args.kwonlyargs, node.args.kw_defaults, strict=True)]
            for arg, default in pairs:
                if arg.arg in SETTING_NAMES and _literal(default):
                    yield node.lineno, f"{node.name}({arg.arg}=...)"
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
              and len(node.args) == 2 and isinstance(node.args[0], ast.Constant)
              and node.args[0].value in SETTING_NAMES and _literal(node.args[1])):
            yield node.lineno, f'.get("{node.args[0].value}", ...)'


def test_the_code_writes_no_default_of_a_fleet_setting() -> None:
    found = {f"{path.relative_to(CODE)}: {what}": line for path in sorted(CODE.rglob("*.py"))
             for line, what in literal_defaults(ast.parse(path.read_text(encoding="utf-8")))}
    written = [f"{where} (line {line})" for where, line in found.items() if where not in OTHER_MEANINGS]
    assert not written, "a fleet.yaml default written in the code (write it in schemas/fleet.schema.json and read " \
                        "fleetllm.core.fleet.model.DEFAULTS):\n" + "\n".join(written)
    assert set(OTHER_MEANINGS) <= set(found), f"gone, drop them here: {sorted(set(OTHER_MEANINGS) - set(found))}"


@pytest.mark.parametrize("source", [
    "class S:\n    interval_s: int = 61\n",
    "class S:\n    grace_s: int = 1800\n",
    "def f(drain_s: int = 10) -> None: ...\n",
    "def f(*, listen_ports: tuple[int, ...] = (8001, 8002)) -> None: ...\n",
    "budget = knobs.get('max_unavailable', 1)\n",
])
def test_the_scan_finds_a_literal_default(source: str) -> None:
    assert list(literal_defaults(ast.parse(source)))


def test_the_scan_passes_a_default_read_from_the_schema() -> None:
    source = "class S:\n    interval_s: int = DEFAULTS['/reconcile/interval_s']\n    other_s: int = 5\n"
    assert not list(literal_defaults(ast.parse(source)))


def test_the_models_defaults_are_the_files() -> None:
    """The model's DEFAULTS are the schema file's, not a copy."""
    assert dict(model.DEFAULTS) == SCHEMA
