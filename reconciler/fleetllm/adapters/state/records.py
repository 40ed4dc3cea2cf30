"""What the control plane remembers: immutable records passed to and from a StateStore."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum


class BoxApi(StrEnum):
    """Which box-facing endpoint of the box API a recorded request was for (a FetchRecord's `endpoint`).
    Not fleetllm.core.judge.intended.Endpoint, the address and port a server is dialled at."""

    CONFIG = "config"
    REPORT = "report"
    INSTALLER = "installer"
    GATEWAY_NATIVE = "gateway-native"  # GET /vllm/gateway-native/<tag>: the gateway's compiled build


# What one request may put in the store: its text fields are client-controlled (X-LLMAO-Host,
# X-Forwarded-For, and the box name resolved from them), so each is cut at its cap and marked as cut.
# A fetch record or attention entry therefore holds at most MAX_RECORD_CHARS characters of text.
STORED_CHARS = {"peer": 64, "claimed_host": 256, "forwarded_for": 512, "box": 256, "revision": 64, "replica": 128}
TRUNCATED_MARK = "...[truncated: {total} chars]"
MAX_MARK = len(TRUNCATED_MARK.format(total=10**12))
MAX_RECORD_CHARS = sum(STORED_CHARS.values()) + len(STORED_CHARS) * MAX_MARK


def clip(value: str | None, limit: int) -> str | None:
    """`value` if it fits in `limit` characters, else its first `limit` characters and a mark saying
    how long it was."""
    if value is None or len(value) <= limit:
        return value
    return value[:limit] + TRUNCATED_MARK.format(total=len(value))


@dataclass(frozen=True)
class FetchRecord:
    """One box-facing request, answered or not. `box` is the resolved name (None before resolution)."""

    at: float  # unix time
    endpoint: BoxApi
    status: int
    peer: str
    claimed_host: str | None = None  # X-LLMAO-Host as sent
    forwarded_for: str | None = None  # X-Forwarded-For as sent
    box: str | None = None
    revision: str | None = None  # the revision served, when one was
    replica: str | None = None  # which control-plane replica answered (several share one log)
    id: int | None = field(default=None, compare=False)  # the store's, once stored (paging cursor)

    def bounded(self) -> FetchRecord:
        """This record with every text field cut to STORED_CHARS (and marked when cut)."""
        c = STORED_CHARS
        if (len(self.peer) <= c["peer"] and (self.claimed_host is None or len(self.claimed_host) <= c["claimed_host"])
                and (self.forwarded_for is None or len(self.forwarded_for) <= c["forwarded_for"])
                and (self.box is None or len(self.box) <= c["box"])
                and (self.revision is None or len(self.revision) <= c["revision"])
                and (self.replica is None or len(self.replica) <= c["replica"])):
            return self  # nothing to cut (every record of a well-behaved box): no copy
        return replace(self, peer=clip(self.peer, c["peer"]) or "", claimed_host=clip(self.claimed_host,
                       c["claimed_host"]), forwarded_for=clip(self.forwarded_for, c["forwarded_for"]),
                       box=clip(self.box, c["box"]), revision=clip(self.revision, c["revision"]),
                       replica=clip(self.replica, c["replica"]))


@dataclass(frozen=True)
class Sighting:
    """A valid fleet key presented for a box the placement does not have."""

    box: str
    at: float
    peer: str
    claimed_host: str | None = None
    forwarded_for: str | None = None

    def bounded(self) -> Sighting:
        c = STORED_CHARS
        return replace(self, box=clip(self.box, c["box"]) or "", peer=clip(self.peer, c["peer"]) or "",
                       claimed_host=clip(self.claimed_host, c["claimed_host"]),
                       forwarded_for=clip(self.forwarded_for, c["forwarded_for"]))


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
class Approval:
    """An approval made through the control plane: a git commit, recorded here for the audit trail."""

    at: float
    host: str
    models: tuple[str, ...]
    branch: str
    commit: str
    base_revision: str
    actor: str  # who asked, never a token: "admin:<fingerprint>", "token:<name>", "<subject> <email>" or "cli"
