"""File-level problems of a fleet repository, exactly: a missing file, an oversized one, an empty model
catalog, an empty placement, and a YAML error with its mark. Mutation testing (docs/testing.md) showed
their messages, rules and the files they name were not pinned by the unit tests."""

from __future__ import annotations

from fleetllm.adapters.git import read_directory
from fleetllm.core.fleet import strictyaml
from fleetllm.core.fleet.diagnostics import Diagnostic, Severity
from fleetllm.core.fleet.files import FLEET_FILE, MODELS_FILE, PLACEMENT_FILE, NotRegularFile, Oversized, Snapshot
from fleetllm.core.fleet.validate import validate_snapshot
from tests.conftest import EXAMPLE
from tests.fleet.helpers import validate

FILES = dict(read_directory(EXAMPLE).files)
DISPLAY = {name: f"repo/{name}" for name in FILES}


def snapshot(**changes: object) -> Snapshot:
    files = {**FILES, **{name.replace("_", "."): value for name, value in changes.items()}}
    return Snapshot("rev", files, DISPLAY)  # type: ignore[arg-type]


def test_the_example_is_valid() -> None:
    validation = validate_snapshot(snapshot())
    assert validation.fleet is not None and validation.diagnostics == ()
    assert validation.revision == "rev"


def test_a_missing_file() -> None:
    validation = validate_snapshot(snapshot(models_yaml=None))
    assert validation.fleet is None
    assert validation.diagnostics == (Diagnostic("repo/models.yaml", 1, 1, "", "missing: a fleet repository needs "
                                                 "models.yaml", "missing-file"),)


def test_an_oversized_file() -> None:
    validation = validate_snapshot(snapshot(placement_yaml=Oversized(5_000_000)))
    assert validation.fleet is None
    assert validation.diagnostics == (Diagnostic(
        "repo/placement.yaml", 1, 1, "", f"file is 5,000,000 bytes; the limit is {strictyaml.MAX_BYTES:,}",
        "yaml-too-large"),)


def test_an_empty_model_catalog() -> None:
    validation = validate_snapshot(snapshot(models_yaml=b"# nothing yet\n"))
    assert validation.fleet is None
    assert [(d.file, d.message, d.rule) for d in validation.diagnostics] == [
        ("repo/models.yaml", "the model catalog is empty; it needs `models:`", "empty-file")]


def test_a_yaml_error_keeps_its_mark_and_the_other_files_are_still_checked() -> None:
    validation = validate_snapshot(snapshot(fleet_yaml=b"version: 1\nlisten_ports: [8001,\n"))
    assert validation.fleet is None
    (first, *_) = validation.diagnostics
    assert (first.file, first.rule, first.line) == ("repo/fleet.yaml", "yaml-syntax", 3)
    assert first.message.startswith("YAML syntax error: ")


def test_files_are_named_as_displayed() -> None:
    assert {FLEET_FILE, MODELS_FILE, PLACEMENT_FILE} == set(FILES)
    validation = validate_snapshot(snapshot(fleet_yaml=None, placement_yaml=None))
    assert [d.file for d in validation.diagnostics] == ["repo/fleet.yaml", "repo/placement.yaml"]


def test_a_file_that_is_not_a_regular_file_and_the_files_after_it() -> None:
    validation = validate_snapshot(snapshot(fleet_yaml=NotRegularFile("a symbolic link"), placement_yaml=None))
    assert validation.fleet is None
    assert validation.diagnostics == (
        Diagnostic("repo/fleet.yaml", 1, 1, "", "a symbolic link, not a regular file: fleetllm reads only regular "
                   "files (neither followed nor read); commit fleet.yaml itself", "not-a-regular-file"),
        Diagnostic("repo/placement.yaml", 1, 1, "", "missing: a fleet repository needs placement.yaml",
                   "missing-file"))


def test_the_files_after_an_oversized_one_and_an_empty_catalog_are_still_read() -> None:
    oversized = validate_snapshot(snapshot(fleet_yaml=Oversized(9_000_000), placement_yaml=None))
    assert [d.rule for d in oversized.diagnostics] == ["yaml-too-large", "missing-file"]
    empty_catalog = validate_snapshot(snapshot(models_yaml=b"# nothing yet\n", placement_yaml=None))
    assert [d.rule for d in empty_catalog.diagnostics] == ["empty-file", "missing-file"]


def test_a_file_that_does_not_parse_stops_the_semantic_rules() -> None:
    """Without fleet.yaml's listen ports and legacy pair, the example's legacy row would be reported too."""
    validation = validate_snapshot(snapshot(fleet_yaml=b"listen_ports: [9001\n"))
    assert validation.diagnostics == (Diagnostic(
        "repo/fleet.yaml", 2, 1, "", "YAML syntax error: while parsing a flow sequence did not find expected ',' or "
        "']'", "yaml-syntax"),)


def test_an_empty_fleet_yaml_takes_the_defaults_and_the_placement_stays_non_empty() -> None:
    result = validate(fleet="")
    assert result.valid and result.diagnostics == ()


def test_a_placement_that_is_not_a_mapping_is_a_schema_error() -> None:
    validation = validate_snapshot(snapshot(placement_yaml=b"- 1\n"))
    assert validation.fleet is None
    assert [(d.file, d.line, d.message, d.rule, d.severity) for d in validation.diagnostics] == [
        ("repo/fleet.yaml", 13, "legacy pair 198.51.100.23:8000 is declared but no placement row uses it",
         "legacy-unused", Severity.WARNING),
        ("repo/placement.yaml", 1, "a list is not a mapping", "schema-type", Severity.ERROR)]


def test_a_file_that_is_not_a_regular_file_alone_stops_the_semantic_rules() -> None:
    validation = validate_snapshot(snapshot(models_yaml=NotRegularFile("a directory")))
    assert validation.fleet is None
    assert [(d.file, d.rule) for d in validation.diagnostics] == [("repo/models.yaml", "not-a-regular-file")]
