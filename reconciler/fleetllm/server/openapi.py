"""The OpenAPI document as served at GET /api/openapi.yaml: schemas/openapi.yaml, self-contained.

The file reuses the project's JSON Schemas by reference (`$ref: box-report.schema.json`), so that a
request body is checked against the very schema the server validates with. A client that fetched the
document alone could not follow such a reference, so the served copy has each referenced schema
copied under `components/schemas` (named from its file: box-report -> BoxReportSchema) and the
reference pointed there. Built once per process.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import yaml

from fleetllm.core.fleet.schema import load_schema, schema_dir

SUFFIX = ".schema.json"


def component_name(file_name: str) -> str:
    """box-report.schema.json -> BoxReportSchema"""
    stem = file_name.removesuffix(SUFFIX)
    return "".join(part.capitalize() for part in stem.split("-")) + "Schema"


def _bundle(node: Any, found: dict[str, str]) -> Any:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.endswith(SUFFIX) and "/" not in ref:
            found[ref] = component_name(ref)
            return {**{k: v for k, v in node.items() if k != "$ref"}, "$ref": f"#/components/schemas/{found[ref]}"}
        return {key: _bundle(value, found) for key, value in node.items()}
    if isinstance(node, list):
        return [_bundle(item, found) for item in node]
    return node


def bundled(document: dict[str, Any]) -> dict[str, Any]:
    """`document` with every `$ref: NAME.schema.json` replaced by a reference to a copy of that schema."""
    found: dict[str, str] = {}
    out: dict[str, Any] = _bundle(document, found)
    schemas = out.setdefault("components", {}).setdefault("schemas", {})
    for file_name, name in sorted(found.items()):
        schema = dict(load_schema(file_name.removesuffix(SUFFIX)))
        for key in ("$schema", "$id"):
            schema.pop(key, None)
        schemas[name] = schema
    return out


def source_document() -> dict[str, Any]:
    with (schema_dir() / "openapi.yaml").open(encoding="utf-8") as fh:
        document: dict[str, Any] = yaml.safe_load(fh)
    return document


@cache
def served_document() -> bytes:
    return yaml.safe_dump(bundled(source_document()), sort_keys=False, allow_unicode=True).encode()
