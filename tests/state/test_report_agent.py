"""The box report's optional `agent` flag (issue 14): parsed, defaulting to False, refused when not a
boolean, stored and read back on both engines (from the stored report body: no column, no migration)."""

from __future__ import annotations

import json

import pytest

from fleetllm.adapters.state.sqlstore import SqlStateStore
from fleetllm.core.boxreport import BoxReport
from fleetllm.server.reports import ReportError, parse_report, report_json

BASE = {"revision": "abc123", "installer_version": "0.1.0", "outcome": "installed", "message": "ok"}


def parse(document: dict[str, object]) -> BoxReport:
    return parse_report(json.dumps(document).encode(), "box-a", "127.0.0.1", 1.0)


def test_agent_flag_defaults_to_false_and_is_parsed() -> None:
    assert parse(BASE).agent is False
    assert parse({**BASE, "agent": False}).agent is False
    report = parse_report(json.dumps({**BASE, "agent": True}).encode(), "box-a", "127.0.0.1", 1.0)
    assert report.agent is True
    assert report_json(report)["agent"] is True


@pytest.mark.parametrize("value", ["true", 1, None, []])
def test_agent_flag_must_be_a_boolean(value: object) -> None:
    with pytest.raises(ReportError, match="/agent"):
        parse({**BASE, "agent": value})


def test_agent_flag_survives_the_store(store: SqlStateStore) -> None:
    store.record_report(parse_report(json.dumps({**BASE, "agent": True}).encode(), "a", "192.0.2.1", 1.0), keep=3)
    store.record_report(parse_report(json.dumps(BASE).encode(), "b", "192.0.2.2", 2.0), keep=3)
    latest = store.latest_reports()
    assert latest["a"].agent is True
    assert latest["b"].agent is False
    assert store.report_history("a")[0].agent is True
