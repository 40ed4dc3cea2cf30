"""Schema errors: placed at the right line, with messages that say what to write instead."""

from __future__ import annotations

import json

import pytest
from jsonschema import Draft202012Validator

from fleetllm.core.fleet.schema import load_schema
from tests.fleet.helpers import FLEET, MODELS, PLACEMENT, only, validate


@pytest.mark.parametrize("name", ["fleet", "models", "placement"])
def test_schemas_are_valid_2020_12(name: str) -> None:
    schema = load_schema(name)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    Draft202012Validator.check_schema(schema)


def test_unknown_key_with_a_suggestion() -> None:
    d = only(validate(models=MODELS.replace("max_model_len:", "max_model_lenght:")), "schema-unknown-key")
    assert (d.line, d.column) == (3, 27)
    assert "did you mean 'max_model_len'" in d.message
    assert d.pointer == "/models/m1/vllm/max_model_lenght"


def test_unknown_top_level_key_lists_what_is_allowed() -> None:
    d = only(validate(fleet=FLEET + "zebra: blue\n"), "schema-unknown-key")
    assert d.line == 2 and "listen_ports" in d.message


def test_norway_problem_gets_a_hint() -> None:
    d = only(validate(fleet=FLEET + "allow_empty_placement: yes\n"), "schema-type")
    assert "'yes' is not a boolean" in d.message and "YAML 1.1" in d.message


def test_octal_looking_port_is_a_clear_error() -> None:
    d = only(validate(placement=PLACEMENT.replace("8002]", "08002]")), "schema-type")
    assert "'08002' is not an integer" in d.message and (d.line, d.column) == (4, 12)


def test_row_with_too_many_elements() -> None:
    d = only(validate(placement=PLACEMENT.replace("[m2, 8002]", "[m2, 8002, x, 9, 10]")), "schema-items")
    assert d.line == 4 and "[model, listen_port]" in d.message


def test_missing_required_key_points_at_the_mapping() -> None:
    d = only(validate(models=MODELS.replace("vllm: {model: org/m2,", "vllm: {")), "schema-required")
    assert d.line == 5 and "'model'" in d.message


def test_invalid_model_name_key() -> None:
    d = only(validate(models=MODELS + "  'bad name':\n    vllm: {model: org/x}\n"), "schema-name")
    assert (d.line, d.column) == (6, 3)


def test_enum_error() -> None:
    placement = "hosts:\n  203.0.113.10:\n    provider: aws\n    servers:\n      - [m1, 8001]\n"
    d = only(validate(placement=placement), "schema-enum")
    assert d.line == 3 and '"vast"' in d.message


def test_missing_file_and_yaml_errors_are_reported_together() -> None:
    result = validate(models="models: {a: [1,\n", placement="hosts: {x: 1, x: 2}\n")
    rules = sorted(d.rule for d in result.diagnostics)
    assert "yaml-syntax" in rules and "yaml-duplicate-key" in rules and not result.valid


def test_json_output_is_serialisable() -> None:
    result = validate(placement=PLACEMENT.replace("8002]", "8004]"))
    from fleetllm.core.fleet.diagnostics import format_json

    data = json.loads(format_json(result.diagnostics))
    assert data["valid"] is False and data["diagnostics"][0]["rule"] == "port-not-listen"
