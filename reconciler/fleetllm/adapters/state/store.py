"""The control plane's state behind one small interface, on SQLite (embedded) or PostgreSQL (shared).

Each concern is its own Protocol; `StateStore` is their union. The reconciler's tables have theirs in
reconcile.py. One object implements both (`sqlstore.SqlStateStore`, over either
engine's adapter): to add a table, add a Protocol, a migration (migrations.py) and the methods in
sqlstore.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from fleetllm.adapters.state.control import ControlStore
from fleetllm.adapters.state.passes import PassRecord
from fleetllm.adapters.state.reconcile import CapacityRecords
from fleetllm.adapters.state.records import Approval, AttentionEntry, FetchRecord, Sighting
from fleetllm.core.boxreport import BoxReport
from fleetllm.core.rollout.control import Request
from fleetllm.core.rollout.model import BoxRelease, Rollout
from fleetllm.core.rollout.retire import Retirement
from fleetllm.errors import StateError

KEEP_PASSES = 1000  # pass records kept
DETAILED_PASSES = 10  # of which the newest keep their per-server detail (PassRecord.summary() for the rest)


@dataclass(frozen=True)
class FetchRetention:
    """How much of the fetch log is kept: at most `max_rows` records, none older than `max_age_s`.
    Enforced after a write, at most once every `every_s` (state.fetch_log_max_rows, _max_age_days)."""

    max_rows: int = 200_000
    max_age_s: float = 30 * 86400.0
    every_s: float = 60.0


class FetchLog(Protocol):
    def record_fetch(self, fetch: FetchRecord, *, at: float | None = None) -> None:
        """Store `fetch.bounded()` (client-controlled text is cut to records.STORED_CHARS), at `at` when
        given: one record stands for every answer of its kind (server/boxrecords.py), each at its time."""
        ...

    def record_fetches(self, fetches: Iterable[tuple[FetchRecord, float]]) -> None:
        """record_fetch of each (record, at), in order, handed over at once (a loop turn's answers)."""
        ...

    def recent_fetches(self, *, box: str | None = None, limit: int = 100,
                       before: int | None = None) -> list[FetchRecord]:
        """Newest first; `before`: only records with a smaller id (the next page)."""
        ...

    def last_config_served(self) -> dict[str, FetchRecord]:
        """Per box, the latest GET /vllm/config answered 200 (when it last got its config)."""
        ...

    def last_config_answered(self) -> dict[str, float]:
        """Per box, when a GET /vllm/config of it was last answered 200 or 304 (a boot fetch, or a poll
        that found its config current)."""
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
    """The reconciler's pass records (written by `fleetllm reconcile`/`apply`, read by the status pages)."""

    def record_pass(self, record: PassRecord) -> None:
        """Store the record, keeping the newest KEEP_PASSES, the newest DETAILED_PASSES in full."""
        ...

    def recent_passes(self, limit: int = 20) -> list[PassRecord]:
        """Newest first."""
        ...


MAX_SESSIONS = 10_000  # live status-page sessions kept; the oldest are ended beyond it


class SessionStore(Protocol):
    """Status-page sessions, server-side: the cookie names one by a random id, the store keeps its
    SHA-256 digest (never the id), so logging out (or an admin removing the row) ends it everywhere."""

    def create_session(self, digest: str, role: str, fingerprint: str, created_at: float, expires_at: float) -> None:
        """Store a session; ends expired ones, and the oldest beyond MAX_SESSIONS."""
        ...

    def session_alive(self, digest: str, now: float) -> str | None:
        """The session's role when it exists and has not expired, else None."""
        ...

    def end_session(self, digest: str) -> bool:
        """Delete the session; True when there was one."""
        ...


KEEP_ROLLOUTS = 200  # rollout rows kept (one per target revision)


class RolloutStore(Protocol):
    """Staged rollouts (issue 14): the current rollout, each agent box's release, a person's request.
    Written by the reconcile pass under its pass lock; `request_rollout` by the admin API."""

    def current_rollout(self) -> tuple[Rollout | None, Request | None, str | None]:
        """The newest rollout, and a pending request (pause/resume/abort) with who asked."""
        ...

    def recent_rollouts(self, limit: int = 20) -> list[Rollout]:
        """Newest first."""
        ...

    def box_releases(self) -> dict[str, BoxRelease]: ...

    def box_release(self, box: str) -> BoxRelease | None:
        """One box's release (what GET /vllm/config serves an agent box)."""
        ...

    def latest_report(self, box: str) -> BoxReport | None: ...

    def save_rollout(self, rollout: Rollout, releases: Mapping[str, BoxRelease],
                     taken: Request | None = None, retirements: Mapping[str, Retirement] | None = None,
                     placed_again: frozenset[str] = frozenset()) -> None:
        """In one transaction: update the rollout of its target (or start a new row), replace the box
        releases, clear the request `taken` (only if it is still the pending one), write the retirement
        records a pass changed (never turning a retired one back: `rollout forget` may have written it
        meanwhile) and drop those of boxes placed again."""
        ...

    def retirements(self) -> dict[str, Retirement]:
        """Boxes that left the placement (draining, retiring, retired)."""
        ...

    def forget_box(self, record: Retirement, actor: str, at: float) -> None:
        """`fleetllm rollout forget BOX`: write the retired record, drop the box's release, and audit it, in
        one transaction."""
        ...

    def request_rollout(self, request: Request, actor: str) -> Rollout | None:
        """Record a person's request for the next pass; the current rollout (None: there is none)."""
        ...


class StateStore(FetchLog, AttentionList, ReportStore, ApprovalLog, PassLog, SessionStore, ControlStore,
                 RolloutStore, CapacityRecords, Protocol):
    flush_error: str | None  # why the fetch log could not be written last, until a write succeeds

    @property
    def backend(self) -> str:
        """"sqlite" or "postgresql"."""
        ...

    def prune(self, retention: FetchRetention | None = None, now: float | None = None) -> int:
        """Apply the fetch-log retention (the store's own by default) now; returns how many records
        were dropped."""
        ...

    def pass_lock(self, lock_file: str | Path | None = None) -> AbstractContextManager[None]:
        """Single flight for reconcile passes: raises LockHeld when another pass holds it."""
        ...

    def close(self) -> None: ...


SQLITE_PREFIX = "sqlite:///"
POSTGRES_PREFIXES = ("postgresql://", "postgres://")


def is_postgres(url: str) -> bool:
    return url.startswith(POSTGRES_PREFIXES)


def sqlite_path(url: str, base: Path | None = None) -> Path | None:
    """The file of a `sqlite:///relative` or `sqlite:////absolute` URL (SQLAlchemy's spelling);
    None for `sqlite:///:memory:`. Relative paths are taken from `base` (the config file's folder)."""
    if not url.startswith(SQLITE_PREFIX):
        raise StateError("state url: give sqlite:///PATH (sqlite:////abs/path for an absolute path) or "
                         "postgresql://user@host:port/dbname")
    rest = url[len(SQLITE_PREFIX):]
    if rest == ":memory:":
        return None
    if not rest:
        raise StateError(f"state url {url!r} names no file")
    path = Path(rest)
    return path if path.is_absolute() or base is None else base / path
