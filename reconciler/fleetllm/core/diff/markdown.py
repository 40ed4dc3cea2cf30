"""The pull-request comment: a one-line summary, alerts on top, what to do after merging, then each
section collapsed in `<details>` as a `diff` block. Kept under GitHub's 65,536-character comment
limit: when the report is longer, it is cut at a line, every open block is closed, and a note says
how much is missing and where the whole report is.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from fleetllm.core.diff.report import BoxStatus, Level, Report
from fleetllm.core.diff.sections import Section, box_verdict, sections
from fleetllm.core.diff.summary import summary_line
from fleetllm.core.diff.text import allowed_line, short

GITHUB_COMMENT_LIMIT = 65_536
# Room left for what a workflow adds around the report (the comment marker, a header).
DEFAULT_MAX_CHARS = GITHUB_COMMENT_LIMIT - 1_536
ALERTS = {Level.OUTAGE: ("CAUTION", "Outage"), Level.WARNING: ("WARNING", "Warning"), Level.NOTE: ("NOTE", "Note")}
NOTE_ROOM = 400


@dataclass(frozen=True)
class Block:
    """Lines between an opening and a closing that must both be printed if any line is."""

    opening: tuple[str, ...]
    body: tuple[str, ...]
    closing: tuple[str, ...] = ()


def _fence(lines: Sequence[str]) -> str:
    longest = max((len(m) for line in lines for m in re.findall(r"`+", line)), default=0)
    return "`" * max(3, longest + 1)


def _details(section: Section) -> Block:
    # GitHub colours `!` lines in a diff block as changed; `~` it leaves plain.
    lines = tuple("!" + line[1:] if line.startswith("~") else line for line in section.lines)
    fence = _fence(lines)
    return Block((f"<details><summary>{section.summary}</summary>", "", f"*{section.title}*", "",
                  f"{fence}diff"), lines, (fence, "", "</details>", ""))


def _code(text: str) -> str:
    """Plain text inside a blockquote list: backticks, `<` and `@` cannot open code, HTML or a mention."""
    return text.replace("`", "'").replace("<", "&lt;").replace("@", "&#64;")


def _todo(report: Report) -> list[str]:
    return [f"- [ ] {box_verdict(box)}" for box in report.boxes
            if box.status in (BoxStatus.NEW, BoxStatus.RESTART, BoxStatus.REMOVED)]


def blocks(report: Report, extra: Sequence[Section], cost: Sequence[str] = ()) -> list[Block]:
    found = [Block((), (f"**fleetllm diff** `{short(report.base)}`..`{short(report.head)}`: "
                        f"{summary_line(report)}", ""))]
    if report.allowed:
        found.append(Block(("> [!CAUTION]", "> **Newly allowed vLLM options** (they run code or read files on the "
                            "box; review each before merging):"),
                           tuple(f"> - `{a.model}`: {_code(allowed_line(a)[len(a.model) + 2:])}"
                                 for a in report.allowed), ("",)))
    if cost:  # what the change costs, first thing after the summary (fleetllm.core.cost.CostChange.text_lines)
        found.append(Block(("**Cost** (USD per hour, from the providers' listings)", ""),
                           tuple(f"- {line}" for line in cost), ("",)))
    for level, (kind, label) in ALERTS.items():
        messages = [a.message for a in report.alerts if a.level is level]
        if messages:
            body = [line for m in messages for line in (f"> **{label}:** {m}", ">")][:-1]
            found.append(Block((f"> [!{kind}]",), tuple(body), ("",)))
    if todo := _todo(report):
        found.append(Block(("**After merging** (boot lifetime: the boxes do not change by themselves)", ""),
                           tuple(todo), ("",)))
    if report.deployments:
        found.append(Block((), ("Nothing to do by hand for LiteLLM: the reconciler applies its changes at its "
                                "next pass.", "")))
    found += [_details(s) for s in [*sections(report), *extra]]
    return found


def render_markdown(report: Report, extra: Sequence[Section] = (), max_chars: int = DEFAULT_MAX_CHARS,
                    cost: Sequence[str] = ()) -> str:
    """`cost`: the lines of what the change costs (shown after the summary), none when no price is known."""
    parts = blocks(report, extra, cost)
    total = sum(len(b.body) for b in parts)
    out: list[str] = []
    size = 0
    shown = 0

    def room(lines: Sequence[str]) -> bool:
        return size + sum(len(line) + 1 for line in lines) + NOTE_ROOM <= max_chars

    def add(lines: Sequence[str]) -> None:
        nonlocal size
        out.extend(lines)
        size += sum(len(line) + 1 for line in lines)

    cut = False
    for block in parts:
        if not room([*block.opening, *block.body[:1], *block.closing]):
            break
        add(block.opening)
        for line in block.body:
            if not room([line, *block.closing]):
                cut = True
                break
            add([line])
            shown += 1
        add(block.closing)
        if cut:
            break
    if shown < total:
        add([f"**Truncated:** {total - shown} of {total} report lines are not shown, to stay under GitHub's "
             f"comment limit. The CI job's log has the whole report; locally, run "
             f"`fleetllm diff {short(report.base)} {short(report.head)}`."])
    return "\n".join(out).rstrip("\n") + "\n"
