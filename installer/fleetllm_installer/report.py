"""The body of POST /vllm/report, as agreed with the control plane. Pure.

Lengths are capped at the control plane's limits (schemas/box-report.schema.json there), so a long
error never turns the report itself into a 400.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fleetllm_contract.boxjson import GATEWAY_PROGRAM
from fleetllm_contract.report import ReportOutcome, ServerState
from fleetllm_installer.boxjson import GatewaySpec, ServerSpec
from fleetllm_installer.fit import FitResult
from fleetllm_installer.units import program_name

# Supervisor states that mean "supervisord has it and is running or starting it".
STARTED_STATES = frozenset({"RUNNING", "STARTING"})
MAX_MESSAGE = 8192
MAX_PROBLEM = 1024
MAX_PROBLEMS = 64
MAX_REVISION = 128


def _cap(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def server_state(supervisor_state: str | None) -> ServerState:
    """After `supervisorctl update`: started when supervisord runs or starts it; failed otherwise
    (FATAL, BACKOFF, or not known to supervisord at all)."""
    return ServerState.STARTED if supervisor_state in STARTED_STATES else ServerState.FAILED


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def fit_json(fit: FitResult | None) -> dict[str, Any]:
    if fit is None:
        return {"ok": False, "gpus": [], "vram_needed_gb": 0, "vram_total_gb": 0, "disk_needed_gb": 0,
                "disk_free_gb": 0, "problems": ["the fit check did not run"]}
    return {
        "ok": fit.ok,
        "gpus": [{"index": g.index, "name": g.name, "memory_total_mib": g.memory_total_mib,
                  "memory_free_mib": g.memory_free_mib} for g in fit.gpus],
        "vram_needed_gb": _round(fit.vram_needed_gb),
        "vram_total_gb": _round(fit.vram_total_gb),
        "disk_needed_gb": _round(fit.disk_needed_gb),
        "disk_free_gb": _round(fit.disk_free_gb) if fit.disk_free_gb is not None else 0,
        "problems": [_cap(p, MAX_PROBLEM) for p in fit.problems[:MAX_PROBLEMS]],
    }


def _server(server: ServerSpec, states: Mapping[str, ServerState], fit: FitResult | None) -> dict[str, Any]:
    state = states.get(server.name, ServerState.FAILED)
    entry: dict[str, Any] = {"name": server.name, "port": server.port, "digest": server.digest,
                             "unit": program_name(server.name), "state": str(state)}
    # its share, for box_change(current=): only from a fit that passed (a shortfall's fractions exceed 1)
    placement = fit.placements.get(server.name) if fit is not None and fit.ok else None
    share = placement.gpu_memory_utilization if placement is not None else None
    if share is not None and 0 < share <= 1:
        entry["gpu_memory_utilization"] = share
    return entry


def build_report(*, revision: str, installer_version: str, outcome: ReportOutcome, message: str,
                 fit: FitResult | None, servers: Sequence[ServerSpec], states: Mapping[str, ServerState],
                 units_removed: Sequence[str], gateway: GatewaySpec | None = None,
                 agent: bool = False) -> dict[str, Any]:
    """`states` is keyed by server name, and by GATEWAY_PROGRAM for the box gateway. `agent`: the box
    agent runs on this box (sent only when true, so a box without one reports as before)."""
    report: dict[str, Any] = {
        "revision": _cap(revision, MAX_REVISION),
        "installer_version": installer_version,
        "outcome": str(outcome),
        "message": _cap(message, MAX_MESSAGE),
        "fit": fit_json(fit),
        "servers": [_server(s, states, fit) for s in servers],
        "units_removed": list(units_removed),
    }
    if gateway is not None:
        report["gateway"] = {"port": gateway.port, "digest": gateway.digest, "unit": program_name(GATEWAY_PROGRAM),
                             "state": str(states.get(GATEWAY_PROGRAM, ServerState.FAILED))}
    if agent:
        report["agent"] = True
    return report
