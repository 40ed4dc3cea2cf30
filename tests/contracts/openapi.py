"""Reading the published OpenAPI documents kept in tests/contracts (README.md says which and where from):
the JSON Schema a document gives for an operation's request body or answer, and the problems a body has
against it. Used by the contract tests and by the fakes that validate what they take and answer
(tests/support/fake_forge.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import yaml

HERE = Path(__file__).resolve().parent


def load(name: str) -> dict[str, Any]:
    text = (HERE / name).read_text()
    document: dict[str, Any] = json.loads(text) if name.endswith(".json") else yaml.safe_load(text)
    return document


def nullable_to_type(node: Any) -> Any:
    """OpenAPI 3.0's `nullable: true` as JSON Schema's `"type": [T, "null"]` (3.1 documents already say so)."""
    if isinstance(node, list):
        return [nullable_to_type(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {k: nullable_to_type(v) for k, v in node.items() if k != "nullable"}
    if node.get("nullable") is True:
        if isinstance(out.get("type"), str):
            out["type"] = [out["type"], "null"]
        elif "$ref" in out or "allOf" in out:
            out = {"anyOf": [dict(out), {"type": "null"}]}
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
    return out


def _rooted(document: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` with the document's components beside it, so that its `#/components/...` refs resolve."""
    root = {**schema, "components": document.get("components", {})}
    return nullable_to_type(root) if document["openapi"].startswith("3.0") else root  # type: ignore[no-any-return]


def response_schema(document: dict[str, Any], path: str, status: int, content_type: str,
                    method: str = "get") -> dict[str, Any]:
    """The schema a document gives for METHOD `path` answering `status` with `content_type`."""
    responses = document["paths"][path][method]["responses"]
    response = responses.get(str(status)) or responses.get("default")
    assert response is not None, f"the document defines no {status} answer for {method.upper()} {path}"
    while "$ref" in response:
        response = document["components"]["responses"][response["$ref"].rsplit("/", 1)[1]]
    media = response["content"]
    assert content_type in media, (f"{method.upper()} {path} {status}: the document answers {sorted(media)}, "
                                   f"the fake {content_type}")
    return _rooted(document, media[content_type]["schema"])


def request_schema(document: dict[str, Any], path: str, method: str, content_type: str) -> dict[str, Any]:
    """The schema of METHOD `path`'s request body in `content_type`."""
    media = document["paths"][path][method]["requestBody"]["content"]
    assert content_type in media, f"{method.upper()} {path} takes {sorted(media)}, not {content_type}"
    return _rooted(document, media[content_type]["schema"])


def component_schema(document: dict[str, Any], name: str) -> dict[str, Any]:
    """A schema of the document's components by name (an error body no operation lists, say)."""
    return _rooted(document, {"$ref": f"#/components/schemas/{name}"})


def problems(schema: dict[str, Any], body: Any) -> list[str]:
    """What is wrong with `body` against `schema` (JSON pointer: message), empty when it is valid."""
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(body), key=lambda e: list(e.absolute_path))
    return [f"{'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}" for e in errors[:10]]
