"""The durable state of the control plane and the reconciler (fetch log, attention list, box reports,
approvals, probe histories, pending deletes, passes), on SQLite or PostgreSQL.

`open_store` opens the control plane's store, `open_reconcile_state` the reconciler's view of the same
database (or an in-memory one for tests and one-off runs).
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import psycopg

from fleetllm.adapters.state.postgres import PostgresDatabase
from fleetllm.adapters.state.reconcile import MemoryStore, ReconcileState
from fleetllm.adapters.state.records import (
    Approval,
    AttentionEntry,
    BoxApi,
    FetchRecord,
    Sighting,
)
from fleetllm.adapters.state.sqlite import SqliteDatabase
from fleetllm.adapters.state.sqlstore import SqlStateStore
from fleetllm.adapters.state.store import (
    POSTGRES_PREFIXES,
    SQLITE_PREFIX,
    FetchRetention,
    StateStore,
    is_postgres,
    sqlite_path,
)
from fleetllm.core.boxreport import BoxReport
from fleetllm.core.secret import Secret
from fleetllm.errors import StateError
from fleetllm_contract.report import ReportOutcome

__all__ = [
    "Approval",
    "AttentionEntry",
    "BoxApi",
    "BoxReport",
    "FetchRecord",
    "FetchRetention",
    "ReconcileState",
    "ReportOutcome",
    "Sighting",
    "StateError",
    "StateStore",
    "is_memory_state",
    "open_reconcile_state",
    "open_store",
]


def open_store(url: str, base: Path | None = None, *, password: Secret | None = None,
               retention: FetchRetention | None = None, max_connections: int = 10,
               application_name: str = "fleetllm") -> SqlStateStore:
    """Open (creating and migrating as needed) the store named by `url`: sqlite:///PATH or
    postgresql://... (`password` apart from the URL, revealed only into libpq's connection parameters;
    `max_connections` sizes PostgreSQL's pool)."""
    if is_postgres(url):
        return SqlStateStore(PostgresDatabase(url, password, max_connections=max_connections,
                                              application_name=application_name), retention)
    return SqlStateStore(SqliteDatabase(sqlite_path(url, base)), retention)


MEMORY_URLS = ("memory:", "memory://", "sqlite:///:memory:")


def is_memory_state(url: str | None) -> bool:
    """Whether `url` names no state store of its own (open_reconcile_state opens an in-memory one)."""
    return not url or url in MEMORY_URLS


def open_reconcile_state(url: str | None, password: Secret | None = None) -> ReconcileState:
    """The control plane's state store (fleetllm.adapters.state.open_store: `sqlite:///path/to/file.db` or
    `postgresql://user@host/db`, `password` apart), a plain path for SQLite, or None/`memory:` for an
    in-memory store."""
    if url is None or is_memory_state(url):
        return MemoryStore()
    if "://" in url and not url.startswith((SQLITE_PREFIX, *POSTGRES_PREFIXES)):
        raise ValueError(f"unsupported state URL scheme in {url.split('://')[0]}://…: use sqlite:///PATH or "
                         "postgresql://user@host:port/dbname")
    return open_store(url if "://" in url else SQLITE_PREFIX + url, password=password, max_connections=2,
                            application_name="fleetllm-reconcile")


def look_at_store(url: str, base: Path | None = None, password: Secret | None = None) -> str:
    """Whether the store named by `url` can be used, without creating or writing anything (serve
    --check): PostgreSQL connected to, an SQLite file opened read-only (or the folder it would be made
    in checked). What it found, or StateError saying why not."""
    if is_postgres(url):
        try:
            with psycopg.connect(url, password=password.reveal() if password is not None else None,
                                 connect_timeout=10) as connection:  # the password into libpq only
                connection.execute("SELECT 1")
        except psycopg.Error as exc:
            raise StateError(f"state store {url}: cannot connect: {exc}") from None
        return f"PostgreSQL {url} reachable"
    path = sqlite_path(url, base)
    if path is None:
        return "an in-memory store"
    if path.exists():
        try:
            db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
            try:
                db.execute("SELECT count(*) FROM sqlite_master").fetchone()
            finally:
                db.close()
        except sqlite3.Error as exc:
            raise StateError(f"state store {path}: cannot read it: {exc}") from None
        if not os.access(path, os.W_OK):
            raise StateError(f"state store {path}: not writable by this user")
        return f"SQLite {path}"
    folder = next(p for p in path.parents if p.exists())  # serve creates the missing folders
    if not folder.is_dir() or not os.access(folder, os.W_OK):
        raise StateError(f"state store {path}: cannot be created, {folder} is not a writable folder")
    return f"SQLite {path} (created on the first start)"
