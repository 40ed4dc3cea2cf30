"""Diagnostics: one problem with a fleet file, and its text, JSON and GitHub renderings."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from enum import StrEnum


class Severity(StrEnum):
    ERROR = "error"
    WARNING = "warning"


@dataclass(frozen=True, order=True)
class Diagnostic:
    """`file:line:col: pointer: message [rule]`. Sorted by file, then position."""

    file: str
    line: int
    column: int
    pointer: str  # JSON pointer into the file's document ("" for the whole file)
    message: str
    rule: str
    severity: Severity = Severity.ERROR

    def text(self) -> str:
        where = f"{self.pointer}: " if self.pointer else ""
        level = "" if self.severity is Severity.ERROR else "warning: "
        return f"{self.file}:{self.line}:{self.column}: {level}{where}{self.message} [{self.rule}]"


def pointer(path: Sequence[str | int]) -> str:
    """RFC 6901 JSON pointer for a path of keys and indexes."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in path)


def has_errors(diagnostics: Iterable[Diagnostic]) -> bool:
    return any(d.severity is Severity.ERROR for d in diagnostics)


def format_text(diagnostics: Sequence[Diagnostic]) -> str:
    lines = [d.text() for d in diagnostics]
    errors = sum(1 for d in diagnostics if d.severity is Severity.ERROR)
    warnings = len(diagnostics) - errors
    if errors or warnings:
        lines.append(f"{errors} error{'s' * (errors != 1)}, {warnings} warning{'s' * (warnings != 1)}")
    return "\n".join(lines)


def format_json(diagnostics: Sequence[Diagnostic], **extra: object) -> str:
    return json.dumps({**extra, "valid": not has_errors(diagnostics),
                       "diagnostics": [asdict(d) for d in diagnostics]}, indent=2)


def _escape_data(value: str) -> str:
    return value.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(value: str) -> str:
    return _escape_data(value).replace(":", "%3A").replace(",", "%2C")


def format_github(diagnostics: Sequence[Diagnostic]) -> str:
    """GitHub Actions workflow commands: each diagnostic becomes an annotation on the PR diff."""
    out = []
    for d in diagnostics:
        props = ",".join([f"file={_escape_property(d.file)}", f"line={d.line}", f"col={d.column}",
                          f"title={_escape_property(d.rule)}"])
        where = f"{d.pointer}: " if d.pointer else ""
        out.append(f"::{d.severity.value} {props}::{_escape_data(where + d.message)}")
    return "\n".join(out)
