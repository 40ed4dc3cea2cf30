"""The validation pipeline: strict YAML -> JSON Schema -> typed model -> semantic rules.

Every problem in every file is reported in one run, each at its file, line and column.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
from collections.abc import Iterator
from dataclasses import dataclass

from fleetllm.core.fleet import rules, strictyaml
from fleetllm.core.fleet.build import Finding, build
from fleetllm.core.fleet.diagnostics import Diagnostic, Severity, has_errors, pointer
from fleetllm.core.fleet.files import (
    FLEET_FILE,
    FLEET_FILES,
    MODELS_FILE,
    PLACEMENT_FILE,
    NotRegularFile,
    Oversized,
    Snapshot,
)
from fleetllm.core.fleet.jsonvalue import JSON
from fleetllm.core.fleet.model import Fleet, frozen_map
from fleetllm.core.fleet.schema import validate_document
from fleetllm.core.fleet.strictyaml import Document, Mark

SCHEMAS = {FLEET_FILE: "fleet", MODELS_FILE: "models", PLACEMENT_FILE: "placement"}
EMPTY_VALUES: dict[str, JSON] = {FLEET_FILE: {}, PLACEMENT_FILE: {"hosts": {}}}
START = Mark(1, 1)


@dataclass(frozen=True)
class Validation:
    """The outcome: the model when valid, and every diagnostic (warnings included) either way."""

    revision: str
    fleet: Fleet | None
    diagnostics: tuple[Diagnostic, ...]

    @property
    def valid(self) -> bool:
        return self.fleet is not None

    @property
    def errors(self) -> tuple[Diagnostic, ...]:
        return tuple(d for d in self.diagnostics if d.severity is Severity.ERROR)


def _diagnostic(doc: Document, finding: Finding) -> Diagnostic:
    mark = doc.key_mark(list(finding.path), finding.key) if finding.key is not None else doc.mark_at(
        list(finding.path))
    path = (*finding.path, finding.key) if finding.key is not None else finding.path
    return Diagnostic(doc.path, mark.line, mark.column, pointer(path), finding.message, finding.rule,
                      Severity.WARNING if finding.warning else Severity.ERROR)


def _file_problem(display: str, message: str, rule: str, mark: Mark = START) -> Diagnostic:
    return Diagnostic(display, mark.line, mark.column, "", message, rule)


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic garbage collection while a fleet is parsed and checked. The YAML tree, the schema
    errors and the model are hundreds of thousands of young objects and no cycles: on a 10,000-box
    fleet the collector's repeated scans of them took a third of the time (docs/benchmarks.md).
    Memory is bounded by the file-size and node limits of strictyaml; collection resumes after.
    The rollout's step runs under it too (core/rollout/step.py: tens of thousands of short-lived
    records a pass, bounded by the fleet's size)."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def validate_snapshot(snapshot: Snapshot) -> Validation:
    with gc_paused():
        return _validate(snapshot)


def _validate(snapshot: Snapshot) -> Validation:
    diagnostics: list[Diagnostic] = []
    docs: dict[str, Document] = {}
    unusable = False  # a file missing or unreadable: semantic rules would only produce noise
    for name in FLEET_FILES:
        display = snapshot.display[name]
        content = snapshot.files.get(name)
        if content is None:
            diagnostics.append(_file_problem(display, f"missing: a fleet repository needs {name}",
                                             "missing-file"))
            unusable = True
            continue
        if isinstance(content, NotRegularFile):
            diagnostics.append(_file_problem(display, f"{content.kind}, not a regular file: fleetllm reads only "
                                             f"regular files (neither followed nor read); commit {name} itself",
                                             "not-a-regular-file"))
            unusable = True
            continue
        if isinstance(content, Oversized):
            diagnostics.append(_file_problem(display, f"file is {content.size:,} bytes; the limit is "
                                             f"{strictyaml.MAX_BYTES:,}", "yaml-too-large"))
            unusable = True
            continue
        doc = strictyaml.load(content, display)
        diagnostics.extend(_file_problem(display, p.message, p.rule, p.mark) for p in doc.problems)
        if doc.root is None and doc.problems:
            unusable = True
            continue
        if doc.empty:
            if name == MODELS_FILE:
                diagnostics.append(_file_problem(display, "the model catalog is empty; it needs `models:`",
                                                 "empty-file"))
                unusable = True
                continue
            doc = dataclasses.replace(doc, value=EMPTY_VALUES[name])  # placement: `hosts: {}`, found empty below
        docs[name] = doc

    error_paths: dict[str, set[tuple[str | int, ...]]] = {}
    for name, doc in docs.items():
        found, paths = validate_document(doc, SCHEMAS[name])
        diagnostics.extend(found)
        error_paths[name] = paths

    fleet: Fleet | None = None
    if not unusable:
        placement = docs[PLACEMENT_FILE].value
        hosts = placement.get("hosts") if isinstance(placement, dict) else None
        placement_empty = hosts == {}
        built = build(docs[FLEET_FILE].value, docs[MODELS_FILE].value, placement, error_paths)
        findings = [*built.findings, *rules.check(built, placement_empty)]
        diagnostics.extend(_diagnostic(docs[f.file], f) for f in findings)
        if not has_errors(diagnostics):
            fleet = Fleet(snapshot.revision, built.settings, frozen_map(built.recipes), frozen_map(built.boxes),
                          origin=snapshot.origin)
    return Validation(snapshot.revision, fleet, tuple(sorted(diagnostics)))
