"""docs/metrics.md is generated from the metrics registries (docs/gen_metrics_reference.py) and kept
current: it names every metric both processes export, with every label."""

from __future__ import annotations

import dataclasses

import pytest

from tests.conftest import ROOT
from tests.deploy.promql import exported, generator

REFERENCE = ROOT / "docs" / "metrics.md"


def test_the_metrics_reference_is_generated_from_the_current_registries() -> None:
    assert REFERENCE.read_text() == generator().render(), "docs/metrics.md is stale: run `make docs`"
    assert generator().main(["--check"]) == 0


def test_the_reference_has_every_metric_and_label() -> None:
    text = REFERENCE.read_text()
    assert len(exported()) >= 30
    for series, labels in exported().items():
        row = next(line for line in text.splitlines() if line.startswith(f"| `{series}` |"))
        for label in labels:
            assert f"`{label}`:" in row, (series, label)


def test_a_changed_help_text_makes_it_stale(monkeypatch: pytest.MonkeyPatch) -> None:
    module = generator()
    families = module.exported()
    monkeypatch.setattr(module, "exported", lambda: [*families[:-1], dataclasses.replace(families[-1], help="new")])
    assert module.render() != REFERENCE.read_text()
    assert module.main(["--check"]) == 1


def test_every_registered_metric_is_found_with_its_labels() -> None:
    """The generator reads the registries, not the source: a metric registered without being kept as an
    attribute stops it, and the labels come from the metric objects."""
    assert exported()["fleetllm_box_requests_total"] == {"endpoint", "status"}
    assert exported()["fleetllm_box_last_config_timestamp_seconds"] == {"box"}  # a scrape-time collector's
    assert exported()["fleetllm_rollout_halts_total"] == frozenset()
    assert exported()["fleetllm_reconcile_passes_total"] == {"outcome"}
