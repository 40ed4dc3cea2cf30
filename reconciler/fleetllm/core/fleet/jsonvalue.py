"""JSON-compatible values, and a deep-frozen form for the immutable model."""

from __future__ import annotations

import json
from collections.abc import Mapping
from types import MappingProxyType
from typing import TypeAlias

JSON: TypeAlias = "None | bool | int | float | str | list[JSON] | dict[str, JSON]"
Frozen: TypeAlias = "None | bool | int | float | str | tuple[Frozen, ...] | Mapping[str, Frozen]"

EMPTY: Mapping[str, Frozen] = MappingProxyType({})


def freeze(value: JSON) -> Frozen:
    """Deep-freeze: dicts become read-only mappings, lists become tuples."""
    if isinstance(value, dict):
        return MappingProxyType({k: freeze(v) for k, v in value.items()})
    if isinstance(value, list):
        return tuple(freeze(v) for v in value)
    return value


def freeze_mapping(value: JSON) -> Mapping[str, Frozen]:
    frozen = freeze(value if value is not None else {})
    if not isinstance(frozen, Mapping):
        raise TypeError("expected a mapping")
    return frozen


def thaw(value: Frozen) -> JSON:
    """The inverse of `freeze`: plain dicts and lists, ready for json.dumps."""
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [thaw(v) for v in value]
    return value


def canonical_json(value: JSON | Frozen) -> str:
    """Stable serialisation for digests and comparisons: sorted keys, no whitespace."""
    plain = thaw(value) if isinstance(value, (Mapping, tuple)) else value  # type: ignore[arg-type]
    return json.dumps(plain, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
