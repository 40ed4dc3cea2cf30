"""vLLM command-line flags: rendering a recipe's `settings`, and the flags fleetllm manages.

Rendering follows LLMhop's rules for vLLM (docs/wire-formats.md, "LLMhop"): flags in alphabetical
order; `true` -> `--key`; `false` -> `--no-key` (and `no-key: false` -> `--key`); `null` and `[]`
dropped; a list -> one flag followed by every element; numbers as JSON; mappings as compact JSON;
strings verbatim.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterable, Mapping

from fleetllm.core.fleet.jsonvalue import Frozen, thaw
from fleetllm_contract import vllmflags
from fleetllm_contract.boxjson import MANAGED_FLAGS

__all__ = ["MANAGED_FLAGS", "managed_flags_in", "managed_tokens", "render_settings"]


def _scalar(value: Frozen) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(thaw(value), separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def render_settings(settings: Mapping[str, Frozen]) -> tuple[str, ...]:
    """Render a settings mapping into vLLM argv, by the rules above. Pure and deterministic.

    Flags are ordered by the name they are emitted under, so `enable-x: false` sorts as `no-enable-x`
    (LLMhop's worked example pins this order).
    """
    rendered: list[tuple[str, list[str]]] = []
    for key, value in settings.items():
        if value is None or (isinstance(value, tuple) and not value):
            continue
        if value is False:
            flag = key[3:] if key.startswith("no-") else f"no-{key}"
            rendered.append((flag, [f"--{flag}"]))
        elif value is True:
            rendered.append((key, [f"--{key}"]))
        elif isinstance(value, tuple):
            rendered.append((key, [f"--{key}", *(_scalar(v) for v in value)]))
        else:
            rendered.append((key, [f"--{key}", _scalar(value)]))
    return tuple(token for _, tokens in sorted(rendered) for token in tokens)


def split_args(args: str | Iterable[str]) -> tuple[str, ...]:
    """A recipe's `args`: a list as is, or one string split shell-style."""
    if isinstance(args, str):
        return tuple(shlex.split(args))
    return tuple(args)


def flag_name(token: str) -> str | None:
    """The normalised long-flag name of an argv token (`--Max_Model_Len=4` -> `max-model-len`)."""
    return vllmflags.flag_key(token)


def managed_tokens(argv: Iterable[str]) -> list[tuple[int, str, str]]:
    """(index, token, managed flag) for every token vLLM could read as a managed flag: the flag itself,
    its `--no-` twin, `_` for `-`, `--flag=value`, `--flag.key`, and any prefix of it (vLLM's argument
    parser allows abbreviations)."""
    found = []
    for index, token in enumerate(argv):
        flag = vllmflags.managed_flag(token)
        if flag is not None:
            found.append((index, token, flag))
    return found


def managed_flags_in(argv: Iterable[str]) -> list[str]:
    """The spellings (without values) of the managed flags that argv tries to set."""
    return [vllmflags.spelling(token) for _, token, _ in managed_tokens(argv)]
