"""The embedded StateStore: one SQLite file in WAL mode, schema migrated by the application.

One connection shared by the server's threads behind a lock; other processes (the CLI) can read
concurrently thanks to WAL. Fetch records, the one write on every box request, are buffered and
written in batches (one transaction per batch, at most FLUSH_INTERVAL_S later, and before any read
of the fetch log), so a thousand boxes fetching at once cost a few transactions, not a thousand.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from reconciler.fleet.jsonvalue import canonical_json, freeze_mapping
from reconciler.state.passes import PassRecord
from reconciler.state.records import (
    Approval,
    AttentionEntry,
    BoxReport,
    Endpoint,
    FetchRecord,
    Outcome,
    Sighting,
)
from reconciler.state.store import DETAILED_PASSES, KEEP_PASSES, StateError

FLUSH_INTERVAL_S = 0.5
FLUSH_AT = 512  # pending fetch records that trigger an immediate write
_INSERT_FETCH = ("INSERT INTO fetches (at, endpoint, status, peer, claimed_host, forwarded_for, box, revision) "
                 "VALUES (?, ?, ?, ?, ?, ?, ?, ?)")
FetchRow = tuple[float, str, int, str, str | None, str | None, str | None, str | None]

# Append only: migration N (1-based) takes the schema from version N-1 to N. Never edit a released one.
MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE fetches (
        id INTEGER PRIMARY KEY,
        at REAL NOT NULL,
        endpoint TEXT NOT NULL,
        status INTEGER NOT NULL,
        peer TEXT NOT NULL,
        claimed_host TEXT,
        forwarded_for TEXT,
        box TEXT,
        revision TEXT
    );
    CREATE INDEX fetches_by_box ON fetches (box, id);
    CREATE TABLE attention (
        box TEXT PRIMARY KEY,
        first_seen REAL NOT NULL,
        last_seen REAL NOT NULL,
        count INTEGER NOT NULL,
        peer TEXT NOT NULL,
        claimed_host TEXT,
        forwarded_for TEXT
    );
    CREATE INDEX attention_by_last_seen ON attention (last_seen);
    CREATE TABLE box_reports (
        id INTEGER PRIMARY KEY,
        box TEXT NOT NULL,
        received_at REAL NOT NULL,
        peer TEXT NOT NULL,
        revision TEXT NOT NULL,
        installer_version TEXT NOT NULL,
        outcome TEXT NOT NULL,
        body TEXT NOT NULL
    );
    CREATE INDEX box_reports_by_box ON box_reports (box, id);
    CREATE TABLE approvals (
        id INTEGER PRIMARY KEY,
        at REAL NOT NULL,
        host TEXT NOT NULL,
        models TEXT NOT NULL,
        branch TEXT NOT NULL,
        commit_sha TEXT NOT NULL,
        base_revision TEXT NOT NULL,
        actor TEXT NOT NULL
    );
    """,
    # 2: the reconciler's own state (reconciler/reconcile/store.py): probe histories, pending deletes, passes.
    """
    CREATE TABLE reconcile_server_history (
        box TEXT NOT NULL,
        port INTEGER NOT NULL,
        history TEXT NOT NULL,
        PRIMARY KEY (box, port)
    );
    CREATE TABLE reconcile_pending_delete (
        id TEXT PRIMARY KEY,
        attempts INTEGER NOT NULL,
        last_error TEXT NOT NULL,
        first_failed_at REAL NOT NULL
    );
    CREATE TABLE reconcile_pass (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        started_at REAL NOT NULL,
        revision TEXT NOT NULL,
        mode TEXT NOT NULL,
        ok INTEGER NOT NULL,
        record TEXT NOT NULL
    );
    """,
)



def _fetch(row: sqlite3.Row) -> FetchRecord:
    return FetchRecord(at=row["at"], endpoint=Endpoint(row["endpoint"]), status=row["status"], peer=row["peer"],
                       claimed_host=row["claimed_host"], forwarded_for=row["forwarded_for"], box=row["box"],
                       revision=row["revision"])


def _report(row: sqlite3.Row) -> BoxReport:
    return BoxReport(box=row["box"], received_at=row["received_at"], peer=row["peer"], revision=row["revision"],
                     installer_version=row["installer_version"], outcome=Outcome(row["outcome"]),
                     body=freeze_mapping(json.loads(row["body"])))


class SQLiteStateStore:
    """`path` None: an in-memory database (tests)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._pending: list[FetchRow] = []
        self._pending_lock = threading.Lock()
        self._closed = threading.Event()
        self._flusher: threading.Thread | None = None
        try:
            if path is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(str(path) if path else ":memory:", isolation_level=None,
                                       check_same_thread=False, timeout=5.0)
        except (OSError, sqlite3.Error) as exc:
            raise StateError(f"cannot open the state database {path}: {exc}") from None
        self._db.row_factory = sqlite3.Row
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute("PRAGMA foreign_keys=ON")
            self.migrate()
        except sqlite3.Error as exc:
            self._db.close()
            raise StateError(f"state database {path}: {exc}") from None

    @property
    def schema_version(self) -> int:
        version: int = self._db.execute("PRAGMA user_version").fetchone()[0]
        return version

    def migrate(self) -> None:
        with self._lock:
            current = self.schema_version
            if current > len(MIGRATIONS):
                raise StateError(f"state database {self.path} has schema version {current}, newer than this "
                                 f"llmfleet knows ({len(MIGRATIONS)}); upgrade llmfleet")
            for version in range(current + 1, len(MIGRATIONS) + 1):
                # One transaction per migration, the version bump included: a crash leaves it unapplied.
                self._db.executescript(f"BEGIN IMMEDIATE;\n{MIGRATIONS[version - 1]}\n"
                                       f"PRAGMA user_version = {version};\nCOMMIT;")

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _query(self, sql: str, params: tuple[object, ...] = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self._db.execute(sql, params).fetchall()

    # FetchLog
    def record_fetch(self, fetch: FetchRecord) -> None:
        row: FetchRow = (fetch.at, fetch.endpoint.value, fetch.status, fetch.peer, fetch.claimed_host,
                         fetch.forwarded_for, fetch.box, fetch.revision)
        with self._pending_lock:
            self._pending.append(row)
            full = len(self._pending) >= FLUSH_AT
            if self._flusher is None:
                self._flusher = threading.Thread(target=self._flush_loop, name="llmfleet-fetch-log", daemon=True)
                self._flusher.start()
        if full:
            self.flush()

    def _flush_loop(self) -> None:
        while not self._closed.wait(FLUSH_INTERVAL_S):
            try:
                self.flush()
            except sqlite3.Error:  # the database went away (closed under us): retried next round
                continue

    def flush(self) -> None:
        """Write the buffered fetch records now."""
        with self._pending_lock:
            rows, self._pending = self._pending, []
        if rows:
            with self._transaction() as db:
                db.executemany(_INSERT_FETCH, rows)

    def recent_fetches(self, *, box: str | None = None, limit: int = 100) -> list[FetchRecord]:
        self.flush()
        if box is None:
            rows = self._query("SELECT * FROM fetches ORDER BY id DESC LIMIT ?", (limit,))
        else:
            rows = self._query("SELECT * FROM fetches WHERE box = ? ORDER BY id DESC LIMIT ?",
                               (box, limit))
        return [_fetch(r) for r in rows]

    def last_config_served(self) -> dict[str, FetchRecord]:
        self.flush()
        rows = self._query("SELECT * FROM fetches WHERE id IN (SELECT MAX(id) FROM fetches "
                           "WHERE endpoint = 'config' AND status = 200 GROUP BY box)")
        return {r["box"]: _fetch(r) for r in rows}

    # AttentionList
    def note_unknown(self, sighting: Sighting, max_entries: int) -> int:
        s = sighting
        with self._transaction() as db:
            db.execute("INSERT INTO attention (box, first_seen, last_seen, count, peer, claimed_host, forwarded_for)"
                       " VALUES (?, ?, ?, 1, ?, ?, ?) ON CONFLICT (box) DO UPDATE SET last_seen = excluded.last_seen,"
                       " count = count + 1, peer = excluded.peer, claimed_host = excluded.claimed_host,"
                       " forwarded_for = excluded.forwarded_for",
                       (s.box, s.at, s.at, s.peer, s.claimed_host, s.forwarded_for))
            size: int = db.execute("SELECT COUNT(*) FROM attention").fetchone()[0]
            excess = max(0, size - max_entries)
            if excess:
                db.execute("DELETE FROM attention WHERE box IN (SELECT box FROM attention WHERE box != ? "
                           "ORDER BY last_seen, box LIMIT ?)", (s.box, excess))
            return excess

    def attention(self) -> list[AttentionEntry]:
        rows = self._query("SELECT * FROM attention ORDER BY last_seen DESC, box")
        return [AttentionEntry(box=r["box"], first_seen=r["first_seen"], last_seen=r["last_seen"], count=r["count"],
                               peer=r["peer"], claimed_host=r["claimed_host"], forwarded_for=r["forwarded_for"])
                for r in rows]

    def attention_size(self) -> int:
        size: int = self._query("SELECT COUNT(*) FROM attention")[0][0]
        return size

    def forget(self, box: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM attention WHERE box = ?", (box,))

    # ReportStore
    def record_report(self, report: BoxReport, keep: int) -> None:
        r = report
        with self._transaction() as db:
            db.execute("INSERT INTO box_reports (box, received_at, peer, revision, installer_version, outcome, body) "
                       "VALUES (?, ?, ?, ?, ?, ?, ?)",
                       (r.box, r.received_at, r.peer, r.revision, r.installer_version, r.outcome.value,
                        canonical_json(r.body)))
            db.execute("DELETE FROM box_reports WHERE box = ? AND id NOT IN "
                       "(SELECT id FROM box_reports WHERE box = ? ORDER BY id DESC LIMIT ?)", (r.box, r.box, keep))

    def latest_reports(self) -> dict[str, BoxReport]:
        rows = self._query("SELECT * FROM box_reports WHERE id IN "
                           "(SELECT MAX(id) FROM box_reports GROUP BY box)")
        return {r["box"]: _report(r) for r in rows}

    def report_history(self, box: str, limit: int = 20) -> list[BoxReport]:
        rows = self._query("SELECT * FROM box_reports WHERE box = ? ORDER BY id DESC LIMIT ?",
                           (box, limit))
        return [_report(r) for r in rows]

    # ApprovalLog
    def record_approval(self, approval: Approval) -> None:
        a = approval
        with self._lock:
            self._db.execute("INSERT INTO approvals (at, host, models, branch, commit_sha, base_revision, actor) "
                             "VALUES (?, ?, ?, ?, ?, ?, ?)",
                             (a.at, a.host, json.dumps(list(a.models)), a.branch, a.commit, a.base_revision,
                              a.actor))

    def approvals(self, limit: int = 50) -> list[Approval]:
        rows = self._query("SELECT * FROM approvals ORDER BY id DESC LIMIT ?", (limit,))
        return [Approval(at=r["at"], host=r["host"], models=tuple(json.loads(r["models"])), branch=r["branch"],
                         commit=r["commit_sha"], base_revision=r["base_revision"], actor=r["actor"]) for r in rows]

    # PassLog
    def record_pass(self, record: PassRecord) -> None:
        with self._transaction() as db:
            seq = db.execute("INSERT INTO reconcile_pass (started_at, revision, mode, ok, record) "
                             "VALUES (?, ?, ?, ?, ?)", (record.started_at, record.revision, record.mode, int(record.ok),
                              json.dumps(record.to_json()))).lastrowid
            assert seq is not None
            older = db.execute("SELECT seq, record FROM reconcile_pass WHERE seq = ?",
                               (seq - DETAILED_PASSES,)).fetchone()
            if older is not None:
                slim = PassRecord.from_json(json.loads(older["record"]))
                if slim.detailed:
                    db.execute("UPDATE reconcile_pass SET record = ? WHERE seq = ?",
                               (json.dumps(slim.summary().to_json()), older["seq"]))
            db.execute("DELETE FROM reconcile_pass WHERE seq <= ?", (seq - KEEP_PASSES,))

    def recent_passes(self, limit: int = 20) -> list[PassRecord]:
        rows = self._query("SELECT record FROM reconcile_pass ORDER BY seq DESC LIMIT ?", (limit,))
        return [PassRecord.from_json(json.loads(r["record"])) for r in rows]

    # Housekeeping
    def prune(self, *, keep_fetches: int) -> int:
        self.flush()
        with self._lock:
            cursor = self._db.execute("DELETE FROM fetches WHERE id <= (SELECT MAX(id) FROM fetches) - ?",
                                      (keep_fetches,))
            return cursor.rowcount

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        if self._flusher is not None:
            self._flusher.join(timeout=5)
        self.flush()
        with self._lock:
            self._db.close()
