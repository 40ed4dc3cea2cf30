"""The report body stays inside the control plane's limits, whatever went wrong."""

from __future__ import annotations

from llmfleet_contract.report import ReportOutcome, ServerState
from llmfleet_installer.fit import check_fit
from llmfleet_installer.report import (
    MAX_MESSAGE,
    MAX_PROBLEM,
    MAX_PROBLEMS,
    build_report,
    server_state,
)


def test_long_texts_are_capped() -> None:
    fit = check_fit((), None, disk_free_gb=None, probe_problems=tuple("x" * 5000 for _ in range(100)))
    report = build_report(revision="r" * 300, installer_version="0.1.0", outcome=ReportOutcome.FAILED,
                          message="m" * 20000, fit=fit, servers=(), states={}, units_removed=())
    assert len(report["message"]) == MAX_MESSAGE
    assert report["message"].endswith("...")
    assert len(report["revision"]) == 128
    assert len(report["fit"]["problems"]) == MAX_PROBLEMS
    assert all(len(p) == MAX_PROBLEM for p in report["fit"]["problems"])


def test_fit_that_never_ran() -> None:
    report = build_report(revision="r", installer_version="0.1.0", outcome=ReportOutcome.FAILED, message="bad JSON",
                          fit=None, servers=(), states={}, units_removed=())
    assert report["fit"]["ok"] is False
    assert report["fit"]["problems"] == ["the fit check did not run"]


def test_server_states_after_update() -> None:
    assert server_state("RUNNING") is ServerState.STARTED
    assert server_state("STARTING") is ServerState.STARTED
    assert server_state("FATAL") is ServerState.FAILED
    assert server_state(None) is ServerState.FAILED
