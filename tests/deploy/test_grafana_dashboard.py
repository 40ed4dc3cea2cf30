"""deploy/grafana/fleetllm.json: a Grafana dashboard whose every query parses (a real PromQL parser) and
names only metrics and labels the code exports (the real registries, docs/gen_metrics_reference.py), and
which covers what an operator looks at: passes, actions, verdicts per model, serving vs intended servers,
box fetches and reports, rollouts, attention, HTTP connections."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.deploy.promql import dashboard_file, exported, problems, selectors

DASHBOARD = json.loads(dashboard_file().read_text())


def panels(node: dict[str, Any] = DASHBOARD) -> Iterator[dict[str, Any]]:
    for panel in node.get("panels", ()):
        yield panel
        yield from panels(panel)  # a collapsed row keeps its panels inside


def queries() -> Iterator[tuple[str, str]]:
    for panel in panels():
        for target in panel.get("targets", ()):
            yield f"{panel['title']} / {target['refId']}", target["expr"]


def test_every_query_parses_and_names_exported_metrics_and_labels() -> None:
    assert [p for where, expr in queries() for p in problems(where, expr)] == []


def test_the_check_catches_an_unknown_metric_a_wrong_label_and_bad_syntax() -> None:
    assert problems("x", "sum(rate(fleetllm_box_request_total[$__rate_interval]))")  # a typo
    assert problems("x", 'fleetllm_servers{model="m"}')  # verdict is its label, not model
    assert problems("x", "sum by (model) (fleetllm_model_serving_servers")
    assert problems("x", "fleetllm_model_serving_servers") == []


def used() -> set[str]:
    return {s.name for _, expr in queries() for s in selectors(expr) if s.name}


@pytest.mark.parametrize("metric", [
    "fleetllm_reconcile_passes_total", "fleetllm_reconcile_actions_total", "fleetllm_servers",
    "fleetllm_model_serving_servers", "fleetllm_model_intended_servers", "fleetllm_box_requests_total",
    "fleetllm_box_reports_total", "fleetllm_box_last_config_timestamp_seconds",
    "fleetllm_box_last_report_timestamp_seconds", "fleetllm_rollout_halted", "fleetllm_unknown_boxes",
    "fleetllm_attention_entries", "fleetllm_http_connections_open", "fleetllm_http_connections_refused_total",
    "fleetllm_litellm_up", "fleetllm_last_attempted_revision_valid"])
def test_the_dashboard_shows(metric: str) -> None:
    assert metric in exported()
    assert metric in used()


def test_the_dashboard_is_well_formed() -> None:
    ids = [p["id"] for p in panels()]
    assert len(ids) == len(set(ids))
    assert DASHBOARD["uid"] == "fleetllm"
    assert [v["name"] for v in DASHBOARD["templating"]["list"]] == ["datasource"]
    for panel in panels():
        assert set(panel["gridPos"]) == {"h", "w", "x", "y"}, panel["title"]
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(refs) == len(set(refs)), panel["title"]
        assert all(t["datasource"] == panel["datasource"] for t in panel["targets"]), panel["title"]
