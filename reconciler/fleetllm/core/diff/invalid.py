"""When BASE or HEAD is not a valid fleet there is nothing to compare: say which and why, in each format.

The Markdown form replaces the pull-request comment, so a stale report never outlives a broken push.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict

from fleetllm.core.diff.jsonout import FORMAT_VERSION, KIND
from fleetllm.core.diff.markdown import DEFAULT_MAX_CHARS
from fleetllm.core.diff.summary import plural
from fleetllm.core.diff.text import short
from fleetllm.core.fleet.diagnostics import format_text
from fleetllm.core.fleet.jsonvalue import JSON
from fleetllm.core.fleet.validate import Validation

Side = tuple[str, Validation]  # ("BASE" or "HEAD", its validation)


def headline(sides: Sequence[Side]) -> str:
    bad = [f"{label} ({short(v.revision)}) has {plural(len(v.errors), 'error')}" for label, v in sides
           if not v.valid]
    return "Cannot compare: " + " and ".join(bad) + "; fix them, then push again."


def render_invalid_text(sides: Sequence[Side]) -> str:
    out = [headline(sides)]
    for label, validation in sides:
        if not validation.valid:
            out += ["", f"{label} {short(validation.revision)}:", format_text(validation.diagnostics)]
    return "\n".join(out) + "\n"


def render_invalid_markdown(sides: Sequence[Side], max_chars: int = DEFAULT_MAX_CHARS) -> str:
    out = [f"**fleetllm diff**: {headline(sides)}", ""]
    for label, validation in sides:
        if not validation.valid:
            text = format_text(validation.diagnostics).replace("```", "'''")
            out += [f"<details open><summary>{label} <code>{short(validation.revision)}</code></summary>", "",
                    "```", text, "```", "", "</details>", ""]
    document = "\n".join(out)
    if len(document) > max_chars:
        note = "\n```\n\n</details>\n\n**Truncated.** Run `fleetllm validate` for every error.\n"
        document = document[:max_chars - len(note)].rsplit("\n", 1)[0] + note
    return document.rstrip("\n") + "\n"


def render_invalid_json(sides: Sequence[Side]) -> str:
    doc: dict[str, JSON] = {"format_version": FORMAT_VERSION, "kind": KIND, "valid": False,
                            "summary": headline(sides)}
    for label, validation in sides:
        doc[label.lower()] = {"revision": validation.revision, "valid": validation.valid,
                              "diagnostics": [asdict(d) for d in validation.diagnostics]}
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
