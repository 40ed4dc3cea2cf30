"""What the control plane remembers: immutable records passed to and from a StateStore."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from llmfleet.core.fleet.jsonvalue import EMPTY, Frozen
from llmfleet_contract.report import ReportOutcome


class Endpoint(StrEnum):
    """The box-facing endpoints whose every request is recorded."""

    CONFIG = "config"
    REPORT = "report"
    INSTALLER = "installer"


@dataclass(frozen=True)
class FetchRecord:
    """One box-facing request, answered or not. `box` is the resolved name (None before resolution)."""

    at: float  # unix time
    endpoint: Endpoint
    status: int
    peer: str
    claimed_host: str | None = None  # X-LLMAO-Host as sent
    forwarded_for: str | None = None  # X-Forwarded-For as sent
    box: str | None = None
    revision: str | None = None  # the revision served, when one was
    replica: str | None = None  # which control-plane replica answered (several share one log)


@dataclass(frozen=True)
class Sighting:
    """A valid fleet key presented for a box the placement does not have."""

    box: str
    at: float
    peer: str
    claimed_host: str | None = None
    forwarded_for: str | None = None


@dataclass(frozen=True)
class AttentionEntry:
    box: str
    first_seen: float
    last_seen: float
    count: int
    peer: str  # the latest sighting's
    claimed_host: str | None = None
    forwarded_for: str | None = None


@dataclass(frozen=True)
class BoxReport:
    """What a box said it applied (POST /vllm/report). `body` is the whole validated report."""

    box: str
    received_at: float
    peer: str
    revision: str
    installer_version: str
    outcome: ReportOutcome
    body: Mapping[str, Frozen] = field(default_factory=lambda: EMPTY)

    def failed_servers(self) -> frozenset[str]:
        """Servers the box reported as failed (supervisord gave up on them, or never had them)."""
        servers = self.body.get("servers", ())
        if not isinstance(servers, tuple):
            return frozenset()
        return frozenset(name for s in servers if isinstance(s, Mapping) and s.get("state") == "failed"
                         and isinstance(name := s.get("name"), str))

    def server_digests(self) -> dict[str, str]:
        """Server name -> the boot digest the box applied (compare with the rendered `digest`)."""
        servers = self.body.get("servers", ())
        out: dict[str, str] = {}
        if isinstance(servers, tuple):
            for server in servers:
                if isinstance(server, Mapping):
                    name, digest = server.get("name"), server.get("digest")
                    if isinstance(name, str) and isinstance(digest, str):
                        out[name] = digest
        return out


@dataclass(frozen=True)
class Approval:
    """An approval made through the control plane: a git commit, recorded here for the audit trail."""

    at: float
    host: str
    models: tuple[str, ...]
    branch: str
    commit: str
    base_revision: str
    actor: str  # who asked, never a token: "admin:<token fingerprint>" or "cli"
