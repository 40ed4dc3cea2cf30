"""JSON Schema validation of fleet files, with errors placed at the line and column they concern."""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError

from fleetllm.core.fleet.diagnostics import Diagnostic, pointer
from fleetllm.core.fleet.strictyaml import Document, yaml11_reading


def schema_dir() -> Path:
    """`schemas/` of the source tree, or its copy inside an installed wheel."""
    package = Path(__file__).resolve().parents[2]  # fleetllm/
    packaged = package / "_schemas"
    return packaged if packaged.is_dir() else package.parents[1] / "schemas"


@cache
def load_schema(name: str) -> dict[str, Any]:
    with (schema_dir() / f"{name}.schema.json").open(encoding="utf-8") as fh:
        schema: dict[str, Any] = json.load(fh)
    return schema


def inline_local_refs(node: Any, defs: dict[str, Any], expanding: tuple[str, ...] = ()) -> Any:
    """The schema with every `{"$ref": "#/$defs/x"}` replaced by the definition itself (its sibling
    keywords, if any, kept beside it under `allOf`): the same checks and the same errors, without
    jsonschema resolving a reference for every row (half the validation time of 30,000 rows).
    A recursive reference stays a reference."""
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/") and ref[8:] in defs and ref not in expanding:
            target = inline_local_refs(defs[ref[8:]], defs, (*expanding, ref))
            rest = {k: inline_local_refs(v, defs, expanding) for k, v in node.items() if k != "$ref"}
            return {**rest, "allOf": [*rest.get("allOf", []), target]} if rest else target
        return {k: inline_local_refs(v, defs, expanding) for k, v in node.items()}
    if isinstance(node, list):
        return [inline_local_refs(v, defs, expanding) for v in node]
    return node


@cache
def validator(name: str) -> Draft202012Validator:
    schema = load_schema(name)
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(inline_local_refs(schema, schema.get("$defs", {})),
                                format_checker=Draft202012Validator.FORMAT_CHECKER)


_TYPE_NAMES = {"object": "a mapping", "array": "a list", "string": "a string", "integer": "an integer",
               "number": "a number", "boolean": "a boolean (true/false)", "null": "null"}


def _shown(doc: Document, path: list[str | int], instance: object) -> str:
    raw = doc.raw_at(path)
    if raw is not None and not isinstance(instance, (dict, list)):
        return repr(raw) if isinstance(instance, str) else raw or "null"
    if isinstance(instance, dict):
        return "a mapping"
    if isinstance(instance, list):
        return "a list"
    return json.dumps(instance)


def _expected(types: object) -> str:
    names = [types] if isinstance(types, str) else list(types) if isinstance(types, list) else []
    return " or ".join(_TYPE_NAMES.get(str(t), str(t)) for t in names)


def _hint(doc: Document, path: list[str | int], instance: object) -> str:
    if not isinstance(instance, str):
        return ""
    raw = doc.raw_at(path)
    reading = yaml11_reading(raw) if raw is not None else None
    if reading is None:
        return ""
    return f" (YAML 1.1 tools would read it as {reading}; fleetllm reads YAML 1.2 and keeps it a string)"


def _allowed_keys(schema: dict[str, Any]) -> list[str]:
    return sorted(schema.get("properties", {}))


def _diagnostics_for(doc: Document, error: ValidationError) -> Iterator[Diagnostic]:
    path = list(error.absolute_path)
    instance = error.instance
    kind = str(error.validator)
    schema: dict[str, Any] = dict(error.schema) if isinstance(error.schema, dict) else {}
    description = schema.get("description")

    def at(where: list[str | int], message: str, rule: str, key: str | None = None) -> Diagnostic:
        mark = doc.key_mark(where, key) if key is not None else doc.mark_at(where)
        target = [*where, key] if key is not None else where
        return Diagnostic(doc.path, mark.line, mark.column, pointer(target), message, rule)

    if kind == "additionalProperties" and isinstance(instance, dict):
        allowed = _allowed_keys(schema)
        for key in instance:
            if key in allowed:
                continue
            close = difflib.get_close_matches(key, allowed, n=1)
            suggestion = f"; did you mean {close[0]!r}?" if close else (
                f"; allowed: {', '.join(allowed)}" if allowed else "")
            yield at(path, f"unknown key {key!r}{suggestion}", "schema-unknown-key", key)
        return
    if kind == "required":
        missing = error.message.split("'")[1] if "'" in error.message else str(error.validator_value)
        yield at(path, f"missing required key {missing!r}", "schema-required")
        return
    node = doc.node_at(path)
    if isinstance(instance, str) and node is not None and node.kind == "map" and instance in node.pairs:
        # propertyNames descends into each key without extending the path: the key is the culprit.
        why = description if description else error.message
        yield at(path, f"{instance!r} is not a valid key here: {why}", "schema-name", instance)
        return
    if kind == "type":
        yield at(path, f"{_shown(doc, path, instance)} is not {_expected(error.validator_value)}"
                       f"{_hint(doc, path, instance)}", "schema-type")
        return
    if kind == "enum":
        choices = ", ".join(json.dumps(c) for c in schema.get("enum", []))
        yield at(path, f"{_shown(doc, path, instance)} is not one of {choices}{_hint(doc, path, instance)}",
                 "schema-enum")
        return
    if kind == "pattern":
        why = description if description else f"must match {error.validator_value}"
        yield at(path, f"{_shown(doc, path, instance)} is not allowed here: {why}", "schema-pattern")
        return
    if kind in ("minItems", "maxItems", "items") and isinstance(instance, list):
        count = f"{len(instance)} item{'s' * (len(instance) != 1)}"
        why = f"; {description}" if description else ""
        yield at(path, f"a list of {count} is not allowed here{why}", "schema-items")
        return
    yield at(path, error.message, f"schema-{kind}")


def validate_document(doc: Document, schema_name: str) -> tuple[list[Diagnostic], set[tuple[str | int, ...]]]:
    """Every schema violation in `doc`, each placed where it occurs, and the paths they concern."""
    diagnostics: list[Diagnostic] = []
    paths: set[tuple[str | int, ...]] = set()
    seen: set[tuple[int, int, str]] = set()
    for error in validator(schema_name).iter_errors(doc.value):
        paths.add(tuple(error.absolute_path))
        for diagnostic in _diagnostics_for(doc, error):
            key = (diagnostic.line, diagnostic.column, diagnostic.rule)
            if key in seen:  # maxItems and items:false say the same thing about one row
                continue
            seen.add(key)
            diagnostics.append(diagnostic)
    return diagnostics, paths


@cache
def schema_defaults(name: str) -> dict[str, Any]:
    """Every `default` the schema declares, by JSON pointer (`/litellm/write_concurrency`): the one place
    the control plane's defaults are written (fleetllm.settings reads them; docs/configuration.md shows
    them). Only plain `properties` are walked: a default under `$defs` or inside a list would have no one
    pointer, so the schema declares none there."""
    found: dict[str, Any] = {}

    def walk(node: dict[str, Any], where: str) -> None:
        for key, sub in node.get("properties", {}).items():
            if "default" in sub:
                found[f"{where}/{key}"] = sub["default"]
            walk(sub, f"{where}/{key}")

    walk(load_schema(name), "")
    return found
