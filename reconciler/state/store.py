"""The control plane's state behind one small interface, so that a PostgreSQL store can be added.

Each concern is its own Protocol; `StateStore` is their union. To add a table (reconcile passes,
probe history), add a Protocol here, a migration and the methods in `sqlite.py`, and the Protocol to
`StateStore`'s bases.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from reconciler.state.passes import PassRecord
from reconciler.state.records import Approval, AttentionEntry, BoxReport, FetchRecord, Sighting

KEEP_PASSES = 1000  # pass records kept
DETAILED_PASSES = 10  # of which the newest keep their per-server detail (PassRecord.summary() for the rest)


class StateError(Exception):
    """The store cannot be opened or used (bad URL, unwritable file, a newer schema)."""


class FetchLog(Protocol):
    def record_fetch(self, fetch: FetchRecord) -> None: ...

    def recent_fetches(self, *, box: str | None = None, limit: int = 100) -> list[FetchRecord]:
        """Newest first."""
        ...

    def last_config_served(self) -> dict[str, FetchRecord]:
        """Per box, the latest GET /vllm/config answered 200 (when it last got its config)."""
        ...


class AttentionList(Protocol):
    def note_unknown(self, sighting: Sighting, max_entries: int) -> int:
        """Add or bump the box's entry, evicting the least recently seen beyond `max_entries`.
        Returns how many entries were evicted."""
        ...

    def attention(self) -> list[AttentionEntry]:
        """Most recently seen first."""
        ...

    def attention_size(self) -> int: ...

    def forget(self, box: str) -> None: ...


class ReportStore(Protocol):
    def record_report(self, report: BoxReport, keep: int) -> None:
        """Store the report, keeping the newest `keep` of that box."""
        ...

    def latest_reports(self) -> dict[str, BoxReport]: ...

    def report_history(self, box: str, limit: int = 20) -> list[BoxReport]:
        """Newest first."""
        ...


class ApprovalLog(Protocol):
    def record_approval(self, approval: Approval) -> None: ...

    def approvals(self, limit: int = 50) -> list[Approval]:
        """Newest first."""
        ...


class PassLog(Protocol):
    """The reconciler's pass records (written by `llmfleet reconcile`/`apply`, read by the status pages)."""

    def record_pass(self, record: PassRecord) -> None:
        """Store the record, keeping the newest KEEP_PASSES, the newest DETAILED_PASSES in full."""
        ...

    def recent_passes(self, limit: int = 20) -> list[PassRecord]:
        """Newest first."""
        ...


class StateStore(FetchLog, AttentionList, ReportStore, ApprovalLog, PassLog, Protocol):
    def prune(self, *, keep_fetches: int) -> int:
        """Drop all but the newest `keep_fetches` fetch records; returns how many were dropped."""
        ...

    def close(self) -> None: ...


SQLITE_PREFIX = "sqlite:///"


def sqlite_path(url: str, base: Path | None = None) -> Path | None:
    """The file of a `sqlite:///relative` or `sqlite:////absolute` URL (SQLAlchemy's spelling);
    None for `sqlite:///:memory:`. Relative paths are taken from `base` (the config file's folder)."""
    if not url.startswith(SQLITE_PREFIX):
        raise StateError(f"state url {url!r}: only sqlite:///PATH is supported (sqlite:////abs/path for an "
                         "absolute path)")
    rest = url[len(SQLITE_PREFIX):]
    if rest == ":memory:":
        return None
    if not rest:
        raise StateError(f"state url {url!r} names no file")
    path = Path(rest)
    return path if path.is_absolute() or base is None else base / path


def open_store(url: str, base: Path | None = None) -> StateStore:
    """Open (creating and migrating as needed) the store named by `url`."""
    from reconciler.state.sqlite import SQLiteStateStore

    return SQLiteStateStore(sqlite_path(url, base))
