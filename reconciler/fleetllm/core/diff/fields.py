"""Field-by-field differences between two JSON documents, and how a value is shown in a report."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping

from fleetllm.core.diff.report import ABSENT, Absent, FieldChange, Lifetime, Value
from fleetllm.core.fleet.jsonvalue import JSON

LifetimeOf = Callable[[tuple[str, ...]], Lifetime]


def diff_fields(before: Mapping[str, JSON], after: Mapping[str, JSON], lifetime: Lifetime | LifetimeOf,
                prefix: tuple[str, ...] = ()) -> tuple[FieldChange, ...]:
    """Changed leaves, in key order. Mappings are walked; lists and scalars compare whole."""
    changes: list[FieldChange] = []
    for key in sorted(set(before) | set(after)):
        path = (*prefix, key)
        old: Value = before.get(key, ABSENT)
        new: Value = after.get(key, ABSENT)
        if same(old, new):
            continue
        if isinstance(old, dict) and isinstance(new, dict):
            changes.extend(diff_fields(old, new, lifetime, path))
        else:
            changes.append(FieldChange(path, old, new, lifetime if isinstance(lifetime, Lifetime)
                                       else lifetime(path)))
    return tuple(changes)


def same(a: Value, b: Value) -> bool:
    """Equality as JSON readers see it: 1 == 1.0 (as YAML writes either), but true != 1 and "1" != 1."""
    if isinstance(a, Absent) or isinstance(b, Absent):
        return a is b
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def show(value: Value) -> str:
    """A value in a report line: JSON, or `(absent)`."""
    if isinstance(value, Absent):
        return "(absent)"
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


def field_line(change: FieldChange) -> str:
    return f"{change.field}: {show(change.before)} -> {show(change.after)}"
