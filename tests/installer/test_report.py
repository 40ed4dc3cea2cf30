"""The report body stays inside the control plane's limits, whatever went wrong."""

from __future__ import annotations

from fleetllm_contract.report import ReportOutcome, ServerState
from fleetllm_installer.fit import check_fit
from fleetllm_installer.report import (
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


def test_each_server_reports_its_share_of_the_card_and_the_control_plane_accepts_it() -> None:
    import json

    from fleetllm.server.reports import parse_report
    from fleetllm_installer.boxjson import ServerSpec
    from fleetllm_installer.hardware import Gpu

    servers = tuple(ServerSpec(name=n, model=f"org/{n}", served_model_name=n, port=p, api_key="sk-vllm-testtest",
                               args=(), vram_gb=v, digest=f"sha256:{n}") for n, p, v in (("a", 8001, 10), ("b", 8002, 30)))
    gpu = Gpu(index=0, uuid="GPU-0", name="A100", memory_total_mib=80 * 1024, memory_free_mib=80 * 1024)
    fit = check_fit(servers, (gpu,), None)
    report = build_report(revision="r", installer_version="0.1.0", outcome=ReportOutcome.INSTALLED, message="ok",
                          fit=fit, servers=servers, states={}, units_removed=())
    assert [s["gpu_memory_utilization"] for s in report["servers"]] == [0.325, 0.575]
    stored = parse_report(json.dumps(report).encode(), "box", "192.0.2.1", 0.0)
    assert stored.server_shares() == {"a": 0.325, "b": 0.575}
    unknown = build_report(revision="r", installer_version="0.1.0", outcome=ReportOutcome.INSTALLED, message="ok",
                           fit=check_fit(servers, None, None), servers=servers, states={}, units_removed=())
    assert all("gpu_memory_utilization" not in s for s in unknown["servers"])  # no GPU measured: none set
    small = Gpu(index=0, uuid="GPU-0", name="T4", memory_total_mib=15 * 1024, memory_free_mib=15 * 1024)
    short = build_report(revision="r", installer_version="0.1.0", outcome=ReportOutcome.FIT_FAILED, message="no",
                         fit=check_fit(servers, (small,), None), servers=servers, states={}, units_removed=())
    assert all("gpu_memory_utilization" not in s for s in short["servers"])  # a shortfall's fractions exceed 1
    assert parse_report(json.dumps(short).encode(), "box", "192.0.2.1", 0.0).server_shares() == {}
