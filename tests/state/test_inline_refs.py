"""The schemas with their local $refs inlined (fleetllm.core.fleet.schema.validator, a speed-up for large
fleets) check exactly what the schemas as written check: the same errors, at the same paths."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from fleetllm.core.fleet.schema import inline_local_refs, load_schema, schema_dir, validator
from tests.conftest import EXAMPLE, ROOT

SCHEMAS = sorted(p.name.removesuffix(".schema.json") for p in schema_dir().glob("*.schema.json"))
EXAMPLES = {"placement": EXAMPLE / "placement.yaml", "models": EXAMPLE / "models.yaml", "fleet": EXAMPLE / "fleet.yaml",
            "control-plane": ROOT / "deploy" / "systemd" / "control-plane.yaml"}


def errors(check: Draft202012Validator, instance: Any) -> list[tuple[str, str, str]]:
    return sorted((json.dumps(list(e.absolute_path)), str(e.validator), e.message) for e in check.iter_errors(instance))


def as_written(name: str) -> Draft202012Validator:
    return Draft202012Validator(load_schema(name), format_checker=Draft202012Validator.FORMAT_CHECKER)


@pytest.mark.parametrize("name", SCHEMAS)
def test_no_local_reference_is_left(name: str) -> None:
    schema = load_schema(name)
    assert '"$ref": "#/$defs/' not in json.dumps(inline_local_refs(schema, schema.get("$defs", {}))
                                                  | {"$defs": {}})


def test_siblings_of_a_reference_are_kept() -> None:
    defs = {"s": {"type": "string"}}
    node = {"$ref": "#/$defs/s", "description": "d", "allOf": [{"minLength": 2}]}
    assert inline_local_refs(node, defs) == {"description": "d", "allOf": [{"minLength": 2}, {"type": "string"}]}
    recursive = {"tree": {"type": "array", "items": {"$ref": "#/$defs/tree"}}}
    assert inline_local_refs({"$ref": "#/$defs/tree"}, recursive) == {"type": "array",
                                                                       "items": {"$ref": "#/$defs/tree"}}


JSONISH = st.recursive(st.none() | st.booleans() | st.integers(-5, 70000) | st.floats(allow_nan=False)
                       | st.text(max_size=8), lambda inner: st.lists(inner, max_size=4)
                       | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_same_errors_on_mutated_example_documents(name: str, data: st.DataObject) -> None:
    document = yaml.safe_load(EXAMPLES[name].read_text())
    assert errors(validator(name), document) == errors(as_written(name), document) == []
    mutated = copy.deepcopy(document)
    node: Any = mutated
    for _ in range(data.draw(st.integers(0, 4))):  # walk down a random path, then replace what is there
        keys = list(node) if isinstance(node, dict) else list(range(len(node))) if isinstance(node, list) else []
        if not keys:
            break
        key = data.draw(st.sampled_from(keys))
        if not isinstance(node[key], dict | list):
            break
        node = node[key]
    if isinstance(node, dict) and node:
        node[data.draw(st.sampled_from([*node, "unknown_key"]))] = data.draw(JSONISH)
    elif isinstance(node, list) and node:
        node[data.draw(st.integers(0, len(node) - 1))] = data.draw(JSONISH)
    found = errors(validator(name), mutated)
    assert found == errors(as_written(name), mutated)


def test_mutations_do_find_errors() -> None:
    """The comparison above is not between two empty lists only."""
    document = yaml.safe_load((EXAMPLE / "placement.yaml").read_text())
    document["hosts"]["203.0.113.24"]["servers"][0] = ["qwen3-8b", "eight thousand"]
    found = errors(validator("placement"), document)
    assert found == errors(as_written("placement"), document)
    assert [(path, kind) for path, kind, _ in found] == [('["hosts", "203.0.113.24", "servers", 0, 1]', "type")]
