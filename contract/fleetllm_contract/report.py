"""The box report (POST /vllm/report): the values both the installer and the control plane use."""

from __future__ import annotations

from enum import StrEnum


class ReportOutcome(StrEnum):
    """What an installer run ended with."""

    INSTALLED = "installed"
    FIT_FAILED = "fit_failed"
    FAILED = "failed"
    DRY_RUN = "dry_run"


class ServerState(StrEnum):
    """What the installer did with one server's (or the gateway's) program."""

    WRITTEN = "written"
    STARTED = "started"
    FAILED = "failed"
