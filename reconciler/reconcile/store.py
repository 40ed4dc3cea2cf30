"""The reconciler's state: what it must remember between passes, and what the control plane records.

- per server: the probe history (hysteresis, first seen, last healthy);
- pending deletes (a failed delete is retried next pass, never forgotten);
- pass records (reconciler/state/passes.py), kept by the control plane's store;
- per box, written by the control plane: the last config fetch and the last report-back.

`MemoryStore` for tests; `SqliteStore` keeps its tables in the control plane's SQLite state file (they
are created by that store's migrations, reconciler/state/sqlite.py) and reads the fetch log and the box
reports from it: one state store for both.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

from reconciler.reconcile.intended import ServerKey
from reconciler.reconcile.observed import BoxFacts, BoxReport
from reconciler.reconcile.plan import PendingDelete
from reconciler.reconcile.verdict import ServerHistory
from reconciler.state.passes import ActionRecord, PassRecord
from reconciler.state.records import BoxReport as ControlPlaneReport
from reconciler.state.records import Outcome
from reconciler.state.sqlite import SQLiteStateStore


class StateStore(Protocol):
    def box_facts(self) -> dict[str, BoxFacts]: ...

    def histories(self) -> dict[ServerKey, ServerHistory]: ...

    def save_histories(self, histories: Mapping[ServerKey, ServerHistory]) -> None: ...

    def pending_deletes(self) -> dict[str, PendingDelete]: ...

    def save_pending_deletes(self, pending: Mapping[str, PendingDelete]) -> None: ...

    def record_pass(self, record: PassRecord) -> None: ...

    def recent_passes(self, limit: int = 20) -> list[PassRecord]: ...


@dataclass
class MemoryStore:
    fetches: dict[str, float] = field(default_factory=dict)
    reports: dict[str, BoxReport] = field(default_factory=dict)
    history: dict[ServerKey, ServerHistory] = field(default_factory=dict)
    pending: dict[str, PendingDelete] = field(default_factory=dict)
    passes: list[PassRecord] = field(default_factory=list)

    def box_facts(self) -> dict[str, BoxFacts]:
        return {box: BoxFacts(self.fetches.get(box), self.reports.get(box))
                for box in set(self.fetches) | set(self.reports)}

    def record_fetch(self, box: str, at: float) -> None:
        self.fetches[box] = at

    def record_report(self, box: str, report: BoxReport) -> None:
        self.reports[box] = report

    def histories(self) -> dict[ServerKey, ServerHistory]:
        return dict(self.history)

    def save_histories(self, histories: Mapping[ServerKey, ServerHistory]) -> None:
        self.history = dict(histories)

    def pending_deletes(self) -> dict[str, PendingDelete]:
        return dict(self.pending)

    def save_pending_deletes(self, pending: Mapping[str, PendingDelete]) -> None:
        self.pending = dict(pending)

    def record_pass(self, record: PassRecord) -> None:
        self.passes.append(record)

    def recent_passes(self, limit: int = 20) -> list[PassRecord]:
        return list(reversed(self.passes[-limit:]))


def box_report(report: ControlPlaneReport) -> BoxReport:
    return BoxReport(report.revision, report.server_digests(), report.received_at,
                     fit_ok=report.outcome is not Outcome.FIT_FAILED, failed=report.failed_servers())


class SqliteStore:
    """The control plane's SQLite state file (WAL): its fetch log and reports, and our tables."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self.control_plane = SQLiteStateStore(Path(path))  # opens and migrates, our tables included
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, timeout=30, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA busy_timeout=30000")

    def close(self) -> None:
        self._db.close()
        self.control_plane.close()

    def _tx(self) -> _Transaction:
        return _Transaction(self._db, self._lock)

    def box_facts(self) -> dict[str, BoxFacts]:
        fetches = {box: f.at for box, f in self.control_plane.last_config_served().items()}
        reports = {box: box_report(r) for box, r in self.control_plane.latest_reports().items()}
        return {box: BoxFacts(fetches.get(box), reports.get(box)) for box in set(fetches) | set(reports)}

    def histories(self) -> dict[ServerKey, ServerHistory]:
        return {(box, port): ServerHistory(**json.loads(text))
                for box, port, text in self._db.execute("SELECT box, port, history FROM reconcile_server_history")}

    def save_histories(self, histories: Mapping[ServerKey, ServerHistory]) -> None:
        with self._tx() as db:
            db.execute("DELETE FROM reconcile_server_history")
            db.executemany("INSERT INTO reconcile_server_history VALUES (?, ?, ?)",
                           [(box, port, json.dumps(asdict(h))) for (box, port), h in histories.items()])

    def pending_deletes(self) -> dict[str, PendingDelete]:
        return {row[0]: PendingDelete(*row) for row in self._db.execute(
            "SELECT id, attempts, last_error, first_failed_at FROM reconcile_pending_delete")}

    def save_pending_deletes(self, pending: Mapping[str, PendingDelete]) -> None:
        with self._tx() as db:
            db.execute("DELETE FROM reconcile_pending_delete")
            db.executemany("INSERT INTO reconcile_pending_delete VALUES (?, ?, ?, ?)",
                           [(p.id, p.attempts, p.last_error, p.first_failed_at) for p in pending.values()])

    def record_pass(self, record: PassRecord) -> None:
        self.control_plane.record_pass(record)

    def recent_passes(self, limit: int = 20) -> list[PassRecord]:
        return self.control_plane.recent_passes(limit)


class _Transaction:
    def __init__(self, db: sqlite3.Connection, lock: threading.Lock) -> None:
        self.db, self.lock = db, lock

    def __enter__(self) -> sqlite3.Connection:
        self.lock.acquire()
        self.db.execute("BEGIN IMMEDIATE")
        return self.db

    def __exit__(self, kind: object, value: object, tb: object) -> None:
        try:
            self.db.execute("COMMIT" if kind is None else "ROLLBACK")
        finally:
            self.lock.release()


def open_store(url: str | None) -> StateStore:
    """`sqlite:///path/to/file.db`, a plain path, or None/`memory:` for an in-memory store."""
    if not url or url in ("memory:", "memory://", "sqlite:///:memory:"):
        return MemoryStore()
    if url.startswith("sqlite:///"):
        return SqliteStore(url[len("sqlite:///"):])  # sqlite:///relative, sqlite:////absolute
    if "://" in url:
        raise ValueError(f"unsupported state URL scheme in {url.split('://')[0]}://…: use sqlite:///PATH")
    return SqliteStore(url)


__all__ = ["ActionRecord", "MemoryStore", "PassRecord", "SqliteStore", "StateStore", "box_report", "open_store"]
