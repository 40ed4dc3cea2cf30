"""The state store on either engine: the control plane's records and the reconciler's, one object.

`SqlStateStore(database)` implements the control plane's Protocols (reconciler/fleetllm/adapters/state/store.py) and the
reconciler's (reconciler/fleetllm/adapters/state/reconcile.py) with SQL written once (the portable subset,
reconciler/fleetllm/adapters/state/dialect.py) over an engine adapter: `SqliteDatabase` or `PostgresDatabase`.

Fetch records, the one write on every box request, are buffered and written in batches by a
background thread (one transaction per batch, at most FLUSH_INTERVAL_S later or as soon as FLUSH_AT
are waiting, and before any read of the fetch log), so a thousand boxes fetching at once cost a few
transactions, not a thousand, and a request never waits on the database. After a write, at most once
every `retention.every_s`, the fetch log is pruned to its retention (by count and by age). When the
database is unreachable the records wait in the buffer (up to MAX_PENDING) and are written once it
is back; box requests are answered all the same. The log has no index by box: each record would dirty a
leaf of it (a WAL page a record once the log holds its 200,000); each box's latest answered and served
GET /vllm/config is kept in box_last_fetch instead, a row a box, updated by each batch's transaction.
"""

from __future__ import annotations

import collections
import functools
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from dataclasses import asdict
from pathlib import Path
from typing import Protocol

from fleetllm.adapters.state.control import ControlTables
from fleetllm.adapters.state.dialect import Dialect, Row, Tx
from fleetllm.adapters.state.passes import PassRecord
from fleetllm.adapters.state.records import (
    Approval,
    AttentionEntry,
    BoxApi,
    FetchRecord,
    Sighting,
)
from fleetllm.adapters.state.store import DETAILED_PASSES, KEEP_PASSES, KEEP_ROLLOUTS, MAX_SESSIONS, FetchRetention
from fleetllm.core.boxreport import BoxReport
from fleetllm.core.capacity import Attempts, RentalWait
from fleetllm.core.control import ControlAction
from fleetllm.core.fleet.jsonvalue import canonical_json, freeze_mapping
from fleetllm.core.fleet.model import Provider
from fleetllm.core.judge.intended import ServerKey
from fleetllm.core.judge.observed import BoxFacts
from fleetllm.core.judge.plan import PendingDelete
from fleetllm.core.judge.verdict import ServerHistory
from fleetllm.core.rollout.control import Request
from fleetllm.core.rollout.model import BoxRelease, BoxState, Rollout, RolloutState
from fleetllm.core.rollout.retire import Retirement, RetireState
from fleetllm.errors import StateError
from fleetllm_contract.report import ReportOutcome

FLUSH_INTERVAL_S = 0.5
FLUSH_AT = 512  # pending fetch records that trigger an immediate write
MAX_PENDING = 100_000  # kept while the database is unreachable; the oldest are dropped beyond it
ROWS_PER_INSERT = 100  # fetch records a statement writes (900 parameters: under SQLite's old limit of 999)
_INSERT_FETCHES = ("INSERT INTO fetches (at, endpoint, status, peer, claimed_host, forwarded_for, box, revision, "
                   "replica) VALUES ")
# Each box's latest GET /vllm/config answered (200 or 304) and served (200) among the records written since
# id `?`: a row a box in box_last_fetch, never moved back by a batch another replica commits after a later one.
# In the order of the boxes, so two replicas' batches lock their rows in one order (no deadlock).
_NOTE_LAST_FETCHES = (
    "INSERT INTO box_last_fetch (box, answered_id, served_id) SELECT box, MAX(id), "
    "MAX(CASE WHEN status = 200 THEN id END) FROM fetches WHERE id > ? AND endpoint = 'config' "
    "AND status IN (200, 304) AND box IS NOT NULL GROUP BY box ORDER BY box ON CONFLICT (box) DO UPDATE SET "
    "answered_id = CASE WHEN excluded.answered_id > box_last_fetch.answered_id THEN excluded.answered_id "
    "ELSE box_last_fetch.answered_id END, "
    "served_id = CASE WHEN box_last_fetch.served_id IS NULL OR excluded.served_id > box_last_fetch.served_id "
    "THEN excluded.served_id ELSE box_last_fetch.served_id END")
FetchRow = tuple[float, str, int, str, str | None, str | None, str | None, str | None, str | None]

log = logging.getLogger("fleetllm.state")


class Database(Protocol):
    """An engine adapter (sqlite.py, postgres.py)."""

    dialect: Dialect
    where: str  # names the database in messages, never with a password

    @property
    def schema_version(self) -> int: ...

    def transaction(self) -> AbstractContextManager[Tx]: ...

    def read(self, statement: str, params: tuple[object, ...] = ()) -> list[Row]: ...

    def pass_lock(self, lock_file: str | Path | None = None) -> AbstractContextManager[None]: ...

    def close(self) -> None: ...


@functools.lru_cache(maxsize=4)
def _insert_statement(rows: int) -> str:
    return _INSERT_FETCHES + ", ".join(["(?, ?, ?, ?, ?, ?, ?, ?, ?)"] * rows)


def _insert_fetches(tx: Tx, rows: list[FetchRow]) -> None:
    """Write `rows` a hundred to a statement: one step of the engine each, where executemany takes one a row,
    and the driver lets go of the GIL and takes it back around every step (on a busy server, a wait for the
    event loop's thread each time, and a hand-over the loop pays for)."""
    for start in range(0, len(rows), ROWS_PER_INSERT):
        chunk = rows[start:start + ROWS_PER_INSERT]
        tx.execute(_insert_statement(len(chunk)), [value for row in chunk for value in row])


def _fetch(row: Row) -> FetchRecord:
    return FetchRecord(at=row["at"], endpoint=BoxApi(row["endpoint"]), status=row["status"], peer=row["peer"],
                       claimed_host=row["claimed_host"], forwarded_for=row["forwarded_for"], box=row["box"],
                       revision=row["revision"], replica=row["replica"], id=row["id"])


def _report(row: Row) -> BoxReport:
    """`agent` is read from the stored body (the whole validated report), so no column or migration."""
    body = freeze_mapping(json.loads(row["body"]))
    return BoxReport(box=row["box"], received_at=row["received_at"], peer=row["peer"], revision=row["revision"],
                     installer_version=row["installer_version"], outcome=ReportOutcome(row["outcome"]),
                     body=body, agent=body.get("agent", False) is True)


class SqlStateStore(ControlTables):
    db: Database
    def __init__(self, database: Database, retention: FetchRetention | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.db = database
        self.retention = retention or FetchRetention()
        self.clock = clock
        # Appended by every box request and drained by the writer: a deque, whose append and popleft
        # are atomic, so a request takes no lock to record its fetch.
        self._pending: collections.deque[FetchRow] = collections.deque()
        self._starting = threading.Lock()  # only until the writer thread exists
        self._flush_lock = threading.Lock()  # one batch at a time keeps the log in arrival order
        self._closed = threading.Event()
        self._wake = threading.Event()
        self._flusher: threading.Thread | None = None
        self._last_prune = clock()
        self.flush_error: str | None = None  # the last failed write of the fetch log, until one succeeds

    @property
    def backend(self) -> str:
        return self.db.dialect.name

    @property
    def where(self) -> str:
        return self.db.where

    @property
    def schema_version(self) -> int:
        return self.db.schema_version

    # FetchLog
    def record_fetch(self, fetch: FetchRecord, *, at: float | None = None) -> None:
        self.record_fetches(((fetch, fetch.at if at is None else at),))

    def record_fetches(self, fetches: Iterable[tuple[FetchRecord, float]]) -> None:
        rows: list[FetchRow] = []
        for fetch, at in fetches:
            fetch = fetch.bounded()  # client-controlled text: at most MAX_RECORD_CHARS stored per request
            rows.append((at, fetch.endpoint.value, fetch.status, fetch.peer, fetch.claimed_host, fetch.forwarded_for,
                         fetch.box, fetch.revision, fetch.replica))
        self._pending.extend(rows)
        if len(self._pending) >= FLUSH_AT:
            self._wake.set()  # the writer goes now; the request never waits on the database
        if self._flusher is None:
            with self._starting:
                if self._flusher is None:
                    self._flusher = threading.Thread(target=self._flush_loop, name="fleetllm-fetch-log",
                                                     daemon=True)
                    self._flusher.start()

    def _flush_loop(self) -> None:
        while not self._closed.is_set():
            self._wake.wait(FLUSH_INTERVAL_S)
            self._wake.clear()
            if not self._closed.is_set():
                self._flush_quietly()

    def _flush_quietly(self) -> None:
        try:
            self.flush()
        except StateError as exc:
            if self.flush_error is None:  # once per outage, not twice a second
                log.error("fetch log not written; kept in memory and retried", extra={"fields": {
                    "error": str(exc), "pending": len(self._pending)}})
            self.flush_error = str(exc)

    def flush(self) -> None:
        """Write the buffered fetch records now (and prune when due). StateError when the database
        cannot be written; the records are kept for the next try."""
        with self._flush_lock:
            # What was recorded until now (the only consumer: _flush_lock is held); later ones wait.
            rows = [self._pending.popleft() for _ in range(len(self._pending))]
            if rows:
                try:
                    with self.db.transaction() as tx:
                        newest = tx.scalar("SELECT MAX(id) AS id FROM fetches")
                        _insert_fetches(tx, rows)
                        tx.execute(_NOTE_LAST_FETCHES, (-1 if newest is None else newest,))
                except StateError:
                    self._pending.extendleft(reversed(rows))  # back in front of any recorded since, in order
                    while len(self._pending) > MAX_PENDING:
                        self._pending.popleft()  # the oldest go first
                    raise
                if self.flush_error is not None:
                    log.info("fetch log written again", extra={"fields": {"records": len(rows)}})
                    self.flush_error = None
            if self.clock() - self._last_prune >= self.retention.every_s:
                self.prune()

    def recent_fetches(self, *, box: str | None = None, limit: int = 100,
                       before: int | None = None) -> list[FetchRecord]:
        self.flush()
        where: list[str] = []
        params: list[object] = []
        if box is not None:
            where.append("box = ?")
            params.append(box)
        if before is not None:
            where.append("id < ?")
            params.append(before)
        clause = f"WHERE {' AND '.join(where)} " if where else ""
        rows = self.db.read(f"SELECT * FROM fetches {clause}ORDER BY id DESC LIMIT ?",  # noqa: S608 - fixed text
                            (*params, limit))
        return [_fetch(r) for r in rows]

    def last_config_served(self) -> dict[str, FetchRecord]:
        self.flush()
        rows = self.db.read("SELECT fetches.* FROM box_last_fetch "
                            "JOIN fetches ON fetches.id = box_last_fetch.served_id")
        return {r["box"]: _fetch(r) for r in rows}

    def last_config_answered(self) -> dict[str, float]:
        self.flush()
        rows = self.db.read("SELECT fetches.box, fetches.at FROM box_last_fetch "
                            "JOIN fetches ON fetches.id = box_last_fetch.answered_id")
        return {r["box"]: float(r["at"]) for r in rows}

    def prune(self, retention: FetchRetention | None = None, now: float | None = None) -> int:
        keep = retention or self.retention
        self._last_prune = self.clock()
        now = self._last_prune if now is None else now
        with self.db.transaction() as tx:
            dropped = tx.execute("DELETE FROM fetches WHERE at < ?", (now - keep.max_age_s,))
            dropped += tx.execute("DELETE FROM fetches WHERE id <= (SELECT id FROM fetches ORDER BY id DESC "
                                  "LIMIT 1 OFFSET ?)", (keep.max_rows,))
            if dropped:  # a box whose records are all gone goes too
                oldest = tx.scalar("SELECT MIN(id) AS id FROM fetches")
                if oldest is None:
                    tx.execute("DELETE FROM box_last_fetch")
                else:
                    tx.execute("DELETE FROM box_last_fetch WHERE answered_id < ?", (oldest,))
        if dropped:
            log.info("fetch log pruned", extra={"fields": {"dropped": dropped, "max_rows": keep.max_rows,
                                                           "max_age_s": keep.max_age_s}})
        return dropped

    # AttentionList
    def note_unknown(self, sighting: Sighting, max_entries: int) -> int:
        s = sighting.bounded()
        with self.db.transaction() as tx:
            tx.execute("INSERT INTO attention (box, first_seen, last_seen, count, peer, claimed_host, forwarded_for)"
                       " VALUES (?, ?, ?, 1, ?, ?, ?) ON CONFLICT (box) DO UPDATE SET last_seen = excluded.last_seen,"
                       " count = attention.count + 1, peer = excluded.peer, claimed_host = excluded.claimed_host,"
                       " forwarded_for = excluded.forwarded_for",
                       (s.box, s.at, s.at, s.peer, s.claimed_host, s.forwarded_for))
            size: int = tx.scalar("SELECT COUNT(*) AS n FROM attention")
            excess = max(0, size - max_entries)
            if excess:
                tx.execute("DELETE FROM attention WHERE box IN (SELECT box FROM attention WHERE box != ? "
                           "ORDER BY last_seen, box LIMIT ?)", (s.box, excess))
            return excess

    def attention(self) -> list[AttentionEntry]:
        rows = self.db.read("SELECT * FROM attention ORDER BY last_seen DESC, box")
        return [AttentionEntry(box=r["box"], first_seen=r["first_seen"], last_seen=r["last_seen"], count=r["count"],
                               peer=r["peer"], claimed_host=r["claimed_host"], forwarded_for=r["forwarded_for"])
                for r in rows]

    def attention_size(self) -> int:
        size: int = self.db.read("SELECT COUNT(*) AS n FROM attention")[0]["n"]
        return size

    def forget(self, box: str) -> None:
        with self.db.transaction() as tx:
            tx.execute("DELETE FROM attention WHERE box = ?", (box,))

    # ReportStore
    def record_report(self, report: BoxReport, keep: int) -> None:
        r = report
        with self.db.transaction() as tx:
            tx.execute("INSERT INTO box_reports (box, received_at, peer, revision, installer_version, outcome, body) "
                       "VALUES (?, ?, ?, ?, ?, ?, ?)",
                       (r.box, r.received_at, r.peer, r.revision, r.installer_version, r.outcome.value,
                        canonical_json(r.body)))
            tx.execute("DELETE FROM box_reports WHERE box = ? AND id NOT IN "
                       "(SELECT id FROM box_reports WHERE box = ? ORDER BY id DESC LIMIT ?)", (r.box, r.box, keep))

    def latest_reports(self) -> dict[str, BoxReport]:
        rows = self.db.read("SELECT * FROM box_reports WHERE id IN (SELECT MAX(id) FROM box_reports GROUP BY box)")
        return {r["box"]: _report(r) for r in rows}

    def report_history(self, box: str, limit: int = 20) -> list[BoxReport]:
        rows = self.db.read("SELECT * FROM box_reports WHERE box = ? ORDER BY id DESC LIMIT ?", (box, limit))
        return [_report(r) for r in rows]

    # ApprovalLog
    def record_approval(self, approval: Approval) -> None:
        a = approval
        with self.db.transaction() as tx:
            tx.execute("INSERT INTO approvals (at, host, models, branch, commit_sha, base_revision, actor) "
                       "VALUES (?, ?, ?, ?, ?, ?, ?)",
                       (a.at, a.host, json.dumps(list(a.models)), a.branch, a.commit, a.base_revision, a.actor))

    def approvals(self, limit: int = 50) -> list[Approval]:
        rows = self.db.read("SELECT * FROM approvals ORDER BY id DESC LIMIT ?", (limit,))
        return [Approval(at=r["at"], host=r["host"], models=tuple(json.loads(r["models"])), branch=r["branch"],
                         commit=r["commit_sha"], base_revision=r["base_revision"], actor=r["actor"]) for r in rows]

    # SessionStore
    def create_session(self, digest: str, role: str, fingerprint: str, created_at: float, expires_at: float) -> None:
        with self.db.transaction() as tx:
            tx.execute("DELETE FROM page_sessions WHERE expires_at <= ?", (created_at,))
            tx.execute("INSERT INTO page_sessions (digest, role, fingerprint, created_at, expires_at) "
                       "VALUES (?, ?, ?, ?, ?)", (digest, role, fingerprint, created_at, expires_at))
            excess = int(tx.scalar("SELECT COUNT(*) AS n FROM page_sessions")) - MAX_SESSIONS
            if excess > 0:
                tx.execute("DELETE FROM page_sessions WHERE digest IN (SELECT digest FROM page_sessions "
                           "ORDER BY created_at, digest LIMIT ?)", (excess,))

    def session_alive(self, digest: str, now: float) -> str | None:
        rows = self.db.read("SELECT role FROM page_sessions WHERE digest = ? AND expires_at > ?", (digest, now))
        return str(rows[0]["role"]) if rows else None

    def end_session(self, digest: str) -> bool:
        with self.db.transaction() as tx:
            return tx.execute("DELETE FROM page_sessions WHERE digest = ?", (digest,)) > 0

    # The reconciler's state (fleetllm.adapters.state.reconcile.StateStore)
    def box_facts(self) -> dict[str, BoxFacts]:
        fetches = {box: f.at for box, f in self.last_config_served().items()}
        reports = self.latest_reports()
        return {box: BoxFacts(fetches.get(box), reports.get(box)) for box in set(fetches) | set(reports)}

    def histories(self) -> dict[ServerKey, ServerHistory]:
        rows = self.db.read("SELECT box, port, history FROM reconcile_server_history")
        return {(r["box"], r["port"]): ServerHistory(**json.loads(r["history"])) for r in rows}

    def save_histories(self, histories: Mapping[ServerKey, ServerHistory]) -> None:
        with self.db.transaction() as tx:
            tx.execute("DELETE FROM reconcile_server_history")
            tx.executemany("INSERT INTO reconcile_server_history (box, port, history) VALUES (?, ?, ?)",
                           [(box, port, json.dumps(asdict(h))) for (box, port), h in histories.items()])

    def pending_deletes(self) -> dict[str, PendingDelete]:
        rows = self.db.read("SELECT id, attempts, last_error, first_failed_at FROM reconcile_pending_delete")
        return {r["id"]: PendingDelete(r["id"], r["attempts"], r["last_error"], r["first_failed_at"]) for r in rows}

    def save_pending_deletes(self, pending: Mapping[str, PendingDelete]) -> None:
        with self.db.transaction() as tx:
            tx.execute("DELETE FROM reconcile_pending_delete")
            tx.executemany("INSERT INTO reconcile_pending_delete (id, attempts, last_error, first_failed_at) "
                           "VALUES (?, ?, ?, ?)",
                           [(p.id, p.attempts, p.last_error, p.first_failed_at) for p in pending.values()])

    def capacity_attempts(self) -> Attempts:
        rows = self.db.read("SELECT key, failures, last_failed_at, error FROM capacity_failures")
        return Attempts({r["key"]: (int(r["failures"]), float(r["last_failed_at"]), r["error"]) for r in rows})

    def rental_waits(self) -> dict[str, RentalWait]:
        rows = self.db.read("SELECT label, provider, ident, rented_at FROM capacity_rentals")
        return {r["label"]: RentalWait(r["label"], Provider(r["provider"]), r["ident"], float(r["rented_at"]))
                for r in rows}

    def save_capacity(self, attempts: Attempts, waits: Mapping[str, RentalWait]) -> None:
        with self.db.transaction() as tx:
            tx.execute("DELETE FROM capacity_failures")
            tx.executemany("INSERT INTO capacity_failures (key, failures, last_failed_at, error) VALUES (?, ?, ?, ?)",
                           [(key, count, at, why) for key, (count, at, why) in attempts.failures.items()])
            tx.execute("DELETE FROM capacity_rentals")
            tx.executemany("INSERT INTO capacity_rentals (label, provider, ident, rented_at) VALUES (?, ?, ?, ?)",
                           [(w.label, str(w.provider), w.ident, w.rented_at) for w in waits.values()])

    def record_pass(self, record: PassRecord) -> None:
        with self.db.transaction() as tx:
            tx.execute("INSERT INTO reconcile_pass (started_at, revision, mode, ok, record) VALUES (?, ?, ?, ?, ?)",
                       (record.started_at, record.revision, record.mode, int(record.ok),
                        json.dumps(record.to_json())))
            seq = int(tx.scalar("SELECT MAX(seq) FROM reconcile_pass"))
            # Older passes keep only their summary; look a few back, as sequences may have gaps.
            for row in tx.rows("SELECT seq, record FROM reconcile_pass WHERE seq <= ? ORDER BY seq DESC LIMIT 5",
                               (seq - DETAILED_PASSES,)):
                older = PassRecord.from_json(json.loads(row["record"]))
                if older.detailed:
                    tx.execute("UPDATE reconcile_pass SET record = ? WHERE seq = ?",
                               (json.dumps(older.summary().to_json()), row["seq"]))
            tx.execute("DELETE FROM reconcile_pass WHERE seq <= ?", (seq - KEEP_PASSES,))

    def recent_passes(self, limit: int = 20) -> list[PassRecord]:
        rows = self.db.read("SELECT record FROM reconcile_pass ORDER BY seq DESC LIMIT ?", (limit,))
        return [PassRecord.from_json(json.loads(r["record"])) for r in rows]

    def recorded_fleet_id(self) -> str | None:
        rows = self.db.read("SELECT fleet_id FROM fleet_identity WHERE name = 'fleet'")
        return str(rows[0]["fleet_id"]) if rows else None

    def record_fleet_id(self, fleet_id: str, revision: str, at: float) -> None:
        if self.recorded_fleet_id() == fleet_id:
            return
        with self.db.transaction() as tx:
            tx.execute("INSERT INTO fleet_identity (name, fleet_id, revision, at) VALUES ('fleet', ?, ?, ?) "
                       "ON CONFLICT (name) DO UPDATE SET fleet_id = excluded.fleet_id, revision = excluded.revision, "
                       "at = excluded.at", (fleet_id, revision, at))

    # RolloutStore
    def current_rollout(self) -> tuple[Rollout | None, Request | None, str | None]:
        rows = self.db.read("SELECT * FROM rollouts ORDER BY id DESC LIMIT 1")
        if not rows:
            return None, None, None
        row = rows[0]
        requested = Request(row["requested"]) if row["requested"] in {r.value for r in Request} else None
        return _rollout(row), requested, row["requested_by"]

    def recent_rollouts(self, limit: int = 20) -> list[Rollout]:
        return [_rollout(r) for r in self.db.read("SELECT * FROM rollouts ORDER BY id DESC LIMIT ?", (limit,))]

    def box_releases(self) -> dict[str, BoxRelease]:
        return {r["box"]: _release(r) for r in self.db.read("SELECT * FROM box_releases")}

    def box_release(self, box: str) -> BoxRelease | None:
        rows = self.db.read("SELECT * FROM box_releases WHERE box = ?", (box,))
        return _release(rows[0]) if rows else None

    def latest_report(self, box: str) -> BoxReport | None:
        rows = self.db.read("SELECT * FROM box_reports WHERE box = ? ORDER BY id DESC LIMIT 1", (box,))
        return _report(rows[0]) if rows else None

    def save_rollout(self, rollout: Rollout, releases: Mapping[str, BoxRelease],
                     taken: Request | None = None, retirements: Mapping[str, Retirement] | None = None,
                     placed_again: frozenset[str] = frozenset()) -> None:
        r = rollout
        with self.db.transaction() as tx:
            for record in (retirements or {}).values():
                _upsert_retirement(tx, record)
            for box in sorted(placed_again):
                tx.execute("DELETE FROM box_retirements WHERE box = ?", (box,))
            newest = tx.rows("SELECT id, target FROM rollouts ORDER BY id DESC LIMIT 1")
            if newest and newest[0]["target"] == r.target:
                tx.execute("UPDATE rollouts SET state = ?, reason = ?, updated_at = ?, waves = ? WHERE id = ?",
                           (r.state.value, r.reason, r.updated_at, r.waves, newest[0]["id"]))
                if taken is not None:
                    tx.execute("UPDATE rollouts SET requested = NULL, requested_by = NULL "
                               "WHERE id = ? AND requested = ?", (newest[0]["id"], taken.value))
            else:
                tx.execute("INSERT INTO rollouts (target, state, reason, started_at, updated_at, waves) "
                           "VALUES (?, ?, ?, ?, ?, ?)",
                           (r.target, r.state.value, r.reason, r.started_at, r.updated_at, r.waves))
                last = int(tx.scalar("SELECT MAX(id) FROM rollouts"))
                tx.execute("DELETE FROM rollouts WHERE id <= ?", (last - KEEP_ROLLOUTS,))
            tx.execute("DELETE FROM box_releases")
            tx.executemany("INSERT INTO box_releases (box, revision, last_good, released_at, state, drain_started_at, "
                           "wave, reason) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                           [(b.box, b.revision, b.last_good, b.released_at, b.state.value, b.drain_started_at,
                             b.wave, b.reason) for b in releases.values()])

    def retirements(self) -> dict[str, Retirement]:
        return {r["box"]: _retirement(r) for r in self.db.read("SELECT * FROM box_retirements")}

    def forget_box(self, record: Retirement, actor: str, at: float) -> None:
        with self.db.transaction() as tx:
            _upsert_retirement(tx, record)
            tx.execute("DELETE FROM box_releases WHERE box = ?", (record.box,))
        self.record_control(ControlAction.ROLLOUT_FORGET, actor, at, reason=f"box {record.box}",
                            revision=record.revision)

    def request_rollout(self, request: Request, actor: str) -> Rollout | None:
        with self.db.transaction() as tx:
            rows = tx.rows("SELECT * FROM rollouts ORDER BY id DESC LIMIT 1")
            if not rows:
                return None
            tx.execute("UPDATE rollouts SET requested = ?, requested_by = ? WHERE id = ?",
                       (request.value, actor[:200], rows[0]["id"]))
            return _rollout(rows[0])

    # Housekeeping
    def pass_lock(self, lock_file: str | Path | None = None) -> AbstractContextManager[None]:
        return self.db.pass_lock(lock_file)

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        self._wake.set()
        if self._flusher is not None:
            self._flusher.join(timeout=5)
        try:
            self.flush()
        finally:
            self.db.close()


def _rollout(row: Row) -> Rollout:
    return Rollout(target=row["target"], state=RolloutState(row["state"]), started_at=row["started_at"],
                   updated_at=row["updated_at"], reason=row["reason"], waves=row["waves"])


def _release(row: Row) -> BoxRelease:
    return BoxRelease(box=row["box"], revision=row["revision"], last_good=row["last_good"],
                      released_at=row["released_at"], state=BoxState(row["state"]),
                      drain_started_at=row["drain_started_at"], wave=row["wave"], reason=row["reason"])



_UPSERT_RETIREMENT = (
    "INSERT INTO box_retirements (box, revision, left_at, state, kept_revision, retiring_at, retired_at, reason) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (box) DO UPDATE SET revision = excluded.revision, "
    "left_at = excluded.left_at, state = excluded.state, kept_revision = excluded.kept_revision, "
    "retiring_at = excluded.retiring_at, retired_at = excluded.retired_at, reason = excluded.reason "
    "WHERE box_retirements.state != 'retired' OR excluded.state = 'retired'")


def _upsert_retirement(tx: Tx, r: Retirement) -> None:
    tx.execute(_UPSERT_RETIREMENT, (r.box, r.revision, r.left_at, r.state.value, r.kept_revision, r.retiring_at,
                                    r.retired_at, r.reason))


def _retirement(row: Row) -> Retirement:
    return Retirement(box=row["box"], revision=row["revision"], left_at=row["left_at"],
                      state=RetireState(row["state"]), kept_revision=row["kept_revision"],
                      retiring_at=row["retiring_at"], retired_at=row["retired_at"], reason=row["reason"])
