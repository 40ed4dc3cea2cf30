"""The reconciler's state: what it must remember between passes, and what the control plane records.

- per server: the probe history (hysteresis, first seen, last healthy);
- pending deletes (a failed delete is retried next pass, never forgotten);
- pass records (revision, verdict counts, actions, errors, duration);
- per box, written by the control plane: the last config fetch and the last report-back.

`MemoryStore` for tests; `SqliteStore` (one file, WAL) until the control plane's state store lands.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from reconciler.reconcile.intended import ServerKey
from reconciler.reconcile.observed import BoxFacts, BoxReport
from reconciler.reconcile.plan import PendingDelete
from reconciler.reconcile.verdict import ServerHistory


@dataclass(frozen=True)
class ActionRecord:
    kind: str
    id: str
    ok: bool
    outcome: str
    error: str | None = None


@dataclass(frozen=True)
class PassRecord:
    started_at: float
    duration_s: float
    revision: str
    mode: str  # "plan" | "apply"
    verdicts: Mapping[str, int]
    actions: tuple[ActionRecord, ...] = ()
    errors: tuple[str, ...] = ()
    blocked: tuple[str, ...] = ()
    held: int = 0
    drift: int = 0

    @property
    def ok(self) -> bool:
        return not self.errors and all(a.ok for a in self.actions)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["verdicts"] = dict(self.verdicts)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PassRecord:
        return cls(data["started_at"], data["duration_s"], data["revision"], data["mode"], dict(data["verdicts"]),
                   tuple(ActionRecord(**a) for a in data.get("actions", ())), tuple(data.get("errors", ())),
                   tuple(data.get("blocked", ())), data.get("held", 0), data.get("drift", 0))


class StateStore(Protocol):
    def box_facts(self) -> dict[str, BoxFacts]: ...

    def record_fetch(self, box: str, at: float) -> None: ...

    def record_report(self, box: str, report: BoxReport) -> None: ...

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


SCHEMA = (
    """CREATE TABLE IF NOT EXISTS reconcile_box_fetch (box TEXT PRIMARY KEY, fetched_at REAL NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS reconcile_box_report (box TEXT PRIMARY KEY, revision TEXT NOT NULL,
       digests TEXT NOT NULL, reported_at REAL NOT NULL, fit_ok INTEGER NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS reconcile_server_history (box TEXT NOT NULL, port INTEGER NOT NULL,
       history TEXT NOT NULL, PRIMARY KEY (box, port))""",
    """CREATE TABLE IF NOT EXISTS reconcile_pending_delete (id TEXT PRIMARY KEY, attempts INTEGER NOT NULL,
       last_error TEXT NOT NULL, first_failed_at REAL NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS reconcile_pass (seq INTEGER PRIMARY KEY AUTOINCREMENT, started_at REAL NOT NULL,
       revision TEXT NOT NULL, mode TEXT NOT NULL, ok INTEGER NOT NULL, record TEXT NOT NULL)""",
)
KEEP_PASSES = 1000


class SqliteStore:
    """One SQLite file in WAL mode; safe for a reconciler and a control plane process side by side."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, timeout=30, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA busy_timeout=30000")
        with self._tx() as db:
            for statement in SCHEMA:
                db.execute(statement)

    def close(self) -> None:
        self._db.close()

    def _tx(self) -> _Transaction:
        return _Transaction(self._db, self._lock)

    def box_facts(self) -> dict[str, BoxFacts]:
        fetches = dict(self._db.execute("SELECT box, fetched_at FROM reconcile_box_fetch").fetchall())
        reports = {box: BoxReport(rev, json.loads(digests), at, bool(fit))
                   for box, rev, digests, at, fit in self._db.execute(
                       "SELECT box, revision, digests, reported_at, fit_ok FROM reconcile_box_report")}
        return {box: BoxFacts(fetches.get(box), reports.get(box)) for box in set(fetches) | set(reports)}

    def record_fetch(self, box: str, at: float) -> None:
        with self._tx() as db:
            db.execute("INSERT INTO reconcile_box_fetch VALUES (?, ?) ON CONFLICT(box) DO UPDATE SET "
                       "fetched_at = excluded.fetched_at", (box, at))

    def record_report(self, box: str, report: BoxReport) -> None:
        with self._tx() as db:
            db.execute("INSERT OR REPLACE INTO reconcile_box_report VALUES (?, ?, ?, ?, ?)",
                       (box, report.revision, json.dumps(dict(report.digests)), report.reported_at,
                        int(report.fit_ok)))

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
        with self._tx() as db:
            db.execute("INSERT INTO reconcile_pass (started_at, revision, mode, ok, record) VALUES (?, ?, ?, ?, ?)",
                       (record.started_at, record.revision, record.mode, int(record.ok), json.dumps(record.to_json())))
            db.execute("DELETE FROM reconcile_pass WHERE seq <= (SELECT MAX(seq) FROM reconcile_pass) - ?",
                       (KEEP_PASSES,))

    def recent_passes(self, limit: int = 20) -> list[PassRecord]:
        rows = self._db.execute("SELECT record FROM reconcile_pass ORDER BY seq DESC LIMIT ?", (limit,))
        return [PassRecord.from_json(json.loads(text)) for (text,) in rows]


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
    if not url or url in ("memory:", "memory://"):
        return MemoryStore()
    if url.startswith("sqlite:///"):
        return SqliteStore(url[len("sqlite:///"):])  # sqlite:///relative, sqlite:////absolute
    if "://" in url:
        raise ValueError(f"unsupported state URL scheme in {url.split('://')[0]}://…: use sqlite:///PATH")
    return SqliteStore(url)
