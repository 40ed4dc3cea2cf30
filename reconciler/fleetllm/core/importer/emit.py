"""Writing an imported Document as YAML with its provenance comments. Pure (text out).

Block mappings for structure, flow style (JSON, which is YAML 1.2) for short lists and leaf mappings, and
plain scalars only where every YAML reader agrees on them (fleetllm's strict loader and YAML 1.1 tools).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

from fleetllm.core.fleet.jsonvalue import Frozen
from fleetllm.core.fleet.strictyaml import resolve_plain, yaml11_reading
from fleetllm.core.importer.llmao import Document

Path_ = tuple[str | int, ...]
_PLAIN = re.compile(r"^[A-Za-z0-9_/][A-Za-z0-9._/+-]*$")
_BLANK_BETWEEN = {("hosts",), ("models",)}  # one blank line between boxes and between models


def scalar(value: Frozen) -> str:
    if isinstance(value, str):
        if _PLAIN.match(value) and resolve_plain(value) == value and yaml11_reading(value) is None:
            return value
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (Mapping, tuple)):
        return flow(value)
    return json.dumps(value)


def flow(value: Frozen) -> str:
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{scalar(k)}: {flow(v)}" for k, v in value.items()) + "}"
    if isinstance(value, tuple):
        return "[" + ", ".join(flow(v) for v in value) + "]"
    return scalar(value)


def _leafy(value: Frozen) -> bool:
    """Written on one line: scalars, lists without mappings, mappings of scalars."""
    if isinstance(value, tuple):
        return all(not isinstance(v, (Mapping, tuple)) for v in value)
    return not isinstance(value, Mapping)


def _emit(value: Mapping[str, Frozen], path: Path_, indent: int, doc: Document, lines: list[str]) -> None:
    pad = " " * indent
    for i, (key, item) in enumerate(value.items()):
        here = (*path, key)
        if path in _BLANK_BETWEEN and i > 0:
            lines.append("")
        comment = doc.comments.get(here)
        if comment:
            lines.append(f"{pad}# {comment}")
        if _leafy(item) or (isinstance(item, Mapping) and not item):
            lines.append(f"{pad}{scalar(key)}: {scalar(item) if not isinstance(item, Mapping) else '{}'}")
        elif isinstance(item, Mapping):
            lines.append(f"{pad}{scalar(key)}:")
            _emit(item, here, indent + 2, doc, lines)
        else:
            assert isinstance(item, tuple)
            lines.append(f"{pad}{scalar(key)}:")
            for j, element in enumerate(item):
                note = doc.comments.get((*here, j))
                if note:
                    lines.append(f"{pad}  # {note}")
                if isinstance(element, Mapping):
                    first = True
                    for k, v in element.items():
                        lines.append(f"{pad}  {'- ' if first else '  '}{scalar(k)}: {scalar(v)}")
                        first = False
                else:
                    lines.append(f"{pad}  - {scalar(element)}")


def to_yaml(doc: Document) -> str:
    lines = [f"# {h}".rstrip() for h in doc.header]
    if lines:
        lines.append("")
    _emit(doc.data, (), 0, doc, lines)
    return "\n".join(lines) + "\n"

