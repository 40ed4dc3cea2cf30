"""What a box reported back (POST /vllm/report): the one record of it. The control plane validates and
stores it (fleetllm.server.reports, the state store's box_reports), the judge reads which boot digest
each server runs and which ones supervisord gave up on (BoxFacts), the rollout whether the box applied
its release and runs the box agent."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from fleetllm.core.fleet.jsonvalue import EMPTY, Frozen
from fleetllm_contract.report import ReportOutcome


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
    agent: bool = False  # sent by the box agent (or an installer that installed it): the box is agent-managed

    def failed_servers(self) -> frozenset[str]:
        """Servers the box reported as failed (supervisord gave up on them, they did not stay up, or it
        never had them)."""
        servers = self.body.get("servers", ())
        if not isinstance(servers, tuple):
            return frozenset()
        return frozenset(name for s in servers if isinstance(s, Mapping) and s.get("state") == "failed"
                         and isinstance(name := s.get("name"), str))

    def runs_nothing(self) -> bool:
        """The box installed a box JSON with no server (a retiring box's) and says so: it runs no program of
        ours. A report without `servers` says nothing about them (capacity terminates only on this)."""
        servers = self.body.get("servers")
        return self.outcome is ReportOutcome.INSTALLED and isinstance(servers, tuple) and not servers

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

    def server_shares(self) -> dict[str, float]:
        """Server name -> the fraction of its card the box gave it (reports that carry it): the `current`
        of fleetllm_contract.division.box_change, so a prediction starts from what the box runs."""
        servers = self.body.get("servers", ())
        out: dict[str, float] = {}
        if isinstance(servers, tuple):
            for server in servers:
                if isinstance(server, Mapping):
                    name, share = server.get("name"), server.get("gpu_memory_utilization")
                    if isinstance(name, str) and isinstance(share, (int, float)) and not isinstance(share, bool):
                        out[name] = float(share)
        return out
