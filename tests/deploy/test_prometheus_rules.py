"""deploy/prometheus: the alert rules pass `promtool check rules` and their unit tests (`promtool test
rules`, recorded series in fleetllm.rules.test.yml); every expression parses and queries only metrics and
labels the code exports; every alert has a severity, a summary, a description and a runbook entry."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import ROOT
from tests.deploy.promql import exported, problems, rules_file, template_metrics
from tests.support.integration import missing

RULES = rules_file()
TESTS = RULES.with_name("fleetllm.rules.test.yml")
RUNBOOKS = ROOT / "docs" / "runbooks.md"
SEVERITIES = {"critical", "warning", "info"}


def alerts() -> list[dict[str, Any]]:
    document = yaml.safe_load(RULES.read_text())
    return [rule for group in document["groups"] for rule in group["rules"] if "alert" in rule]


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:  # .ci/run installs Debian's prometheus package, which ships it
        missing("promtool is not installed (apt-get install prometheus)")
    return path


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False)


def test_promtool_checks_the_rules() -> None:
    done = run("check", "rules", RULES.name, cwd=RULES.parent)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in done.stdout


def test_promtool_unit_tests_pass() -> None:
    done = run("test", "rules", TESTS.name, cwd=TESTS.parent)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_the_unit_tests_can_fail(tmp_path: Path) -> None:
    """A rule that waits an hour longer than the tests expect fails them (the tests see what they check)."""
    (tmp_path / RULES.name).write_text(RULES.read_text().replace("for: 10m", "for: 70m", 1))
    (tmp_path / TESTS.name).write_text(TESTS.read_text())
    done = run("test", "rules", TESTS.name, cwd=tmp_path)
    assert done.returncode != 0
    assert "FleetllmInvalidHead" in done.stdout + done.stderr


def test_every_alert_is_unit_tested_firing() -> None:
    document = yaml.safe_load(TESTS.read_text())
    fired = {case["alertname"] for test in document["tests"] for case in test.get("alert_rule_test", ())
             if case.get("exp_alerts")}
    assert {a["alert"] for a in alerts()} <= fired


def test_every_expression_queries_exported_metrics_and_labels() -> None:
    found = [p for rule in alerts() for p in problems(rule["alert"], rule["expr"])]
    for rule in alerts():
        for name in set().union(*(template_metrics(text) for text in rule["annotations"].values())):
            if name not in exported():
                found.append(f"{rule['alert']}: its annotations query {name!r}, which fleetllm does not export")
    assert found == []


def anchors() -> set[str]:
    return {re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            for m in re.finditer(r"^#+ (.+)$", RUNBOOKS.read_text(), re.M)}


def test_every_alert_has_severity_summary_description_and_a_runbook_entry() -> None:
    names = [a["alert"] for a in alerts()]
    assert len(names) == len(set(names))
    for rule in alerts():
        name = rule["alert"]
        assert rule["labels"]["severity"] in SEVERITIES, name
        notes = rule["annotations"]
        assert notes["summary"].strip() and notes["description"].strip(), name
        url = notes["runbook_url"]
        assert url.split("#")[0].endswith("/docs/runbooks.md"), name
        assert url.split("#")[1] == name.lower(), name
        assert name.lower() in anchors(), f"docs/runbooks.md has no section {name}"


@pytest.mark.parametrize("metric", ["fleetllm_model_serving_servers", "fleetllm_model_intended_servers",
                                    "fleetllm_box_stale_servers", "fleetllm_litellm_up", "fleetllm_rollout_halted",
                                    "fleetllm_unknown_box_last_seen_timestamp_seconds",
                                    "fleetllm_last_attempted_revision_valid",
                                    "fleetllm_reconcile_last_success_timestamp_seconds"])
def test_the_issue_s_alerts_rest_on_these_metrics(metric: str) -> None:
    assert metric in exported()
    assert any(metric in rule["expr"] for rule in alerts())
