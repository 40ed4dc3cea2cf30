"""Query parameters read strictly: a bad value is a 400 with the reason, never a 500.

`str.isdigit()` alone accepts superscripts and other digits that `int()` refuses (`?limit=²` was a
500); only ASCII digits, and few enough of them, are read here.
"""

from __future__ import annotations

from collections.abc import Mapping

from fleetllm.errors import RequestError


class ParamError(RequestError, ValueError):
    """The message names the parameter and what it takes (never echoes more than a short prefix)."""


def int_param(args: Mapping[str, str], name: str, default: int | None, lo: int, hi: int) -> int | None:
    """The integer in `args[name]` (lo..hi), `default` when absent; ParamError otherwise."""
    raw = args.get(name)
    if raw is None:
        return default
    text = raw.strip()
    if not text or len(text) > 18 or not text.isascii() or not text.isdigit() or not lo <= int(text) <= hi:
        raise ParamError(f"{name} must be an integer in {lo}..{hi}")
    return int(text)
