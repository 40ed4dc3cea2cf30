"""The terminal rendering: summary, alerts, then each section."""

from __future__ import annotations

from collections.abc import Sequence

from fleetllm.core.diff.report import AllowedOption, Report
from fleetllm.core.diff.sections import Section, sections
from fleetllm.core.diff.summary import summary_line

LABELS = {"outage": "OUTAGE ", "warning": "WARNING", "note": "NOTE   "}


def short(revision: str) -> str:
    return revision[:12]


def allowed_line(allowed: AllowedOption) -> str:
    """One newly allowed risky option, as the top of the comment and the terminal list it."""
    use = "used at HEAD" if allowed.used else "allowed, not yet used"
    servers = f"{allowed.servers} server{'' if allowed.servers == 1 else 's'}"
    return f"{allowed.model}: --{allowed.option} ({use}; {servers}): {allowed.effect}"


def render_text(report: Report, extra: Sequence[Section] = ()) -> str:
    out = [f"fleetllm diff {short(report.base)}..{short(report.head)}", summary_line(report)]
    if report.allowed:
        out += ["", "NEWLY ALLOWED vLLM OPTIONS (they run code or read files on the box):"]
        out += [f"  {allowed_line(a)}" for a in report.allowed]
    if report.alerts:
        out.append("")
        out += [f"{LABELS[a.level.value]} {a.message}" for a in report.alerts]
    for section in [*sections(report), *extra]:
        out += ["", section.title, *("  " + line for line in section.lines)]
    return "\n".join(out) + "\n"
