"""The shared engine: PostgreSQL through psycopg 3, for several control-plane replicas and reconcilers.

`state.url` is a libpq URL (`postgresql://user@host:port/dbname?sslmode=verify-full`); the password is
never in it but given apart (`state.password: ${cred:NAME}`), or by libpq's own PGPASSFILE. A
connection pool serves the request threads (autocommit; writes in explicit transactions). The tables
live in the connection's current schema (`?options=-csearch_path%3Dname` picks another), and so do
the advisory-lock keys: two fleets can share a database in two schemas.

- schema version: the table `fleetllm_schema`; migrations run under a transaction-level advisory
  lock, so replicas starting together apply each migration once;
- reconcile passes: a session-level advisory lock on a connection of its own, held for the pass;
  PostgreSQL releases it when that session ends, also when its process dies.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from fleetllm.adapters.state.dialect import POSTGRESQL, Row, Tx
from fleetllm.adapters.state.migrations import MIGRATIONS
from fleetllm.core.secret import Secret
from fleetllm.errors import LockHeld, StateError

CONNECT_TIMEOUT_S = 10
# Keepalives notice a vanished peer (and so a vanished lock holder) within about a minute.
SESSION = {"connect_timeout": CONNECT_TIMEOUT_S, "keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10,
           "keepalives_count": 3}


def url_parts(url: str) -> dict[str, Any]:
    """The URL's libpq parameters; StateError (never echoing the URL, which may hold a password)."""
    try:
        return conninfo_to_dict(url)
    except psycopg.Error:
        raise StateError("state url is not a valid PostgreSQL URL (postgresql://user@host:port/dbname)") from None


def display_url(url: str) -> str:
    """user@host:port/dbname: what names the database in messages, without any password."""
    parts = url_parts(url)
    user = f"{parts['user']}@" if parts.get("user") else ""
    port = f":{parts['port']}" if parts.get("port") else ""
    return f"postgresql://{user}{parts.get('host', '')}{port}/{parts.get('dbname', '')}"


def lock_key(purpose: str, schema: str) -> int:
    """A stable signed 64-bit advisory-lock key for `purpose` in `schema`."""
    digest = hashlib.sha256(f"fleetllm:{purpose}:{schema}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


class PostgresDatabase:
    dialect = POSTGRESQL

    def __init__(self, url: str, password: Secret | None = None, *, max_connections: int = 10,
                 application_name: str = "fleetllm") -> None:
        self.where = display_url(url)
        extra: dict[str, Any] = {**SESSION, "application_name": application_name}
        if password is not None:
            extra["password"] = password.reveal()  # into libpq's connection parameters, nowhere else
        self._conninfo = make_conninfo(url, **extra)
        try:
            with psycopg.connect(self._conninfo, autocommit=True) as conn:  # the clear error, if any
                schema = conn.execute("SELECT current_schema()").fetchone()[0]  # type: ignore[index]
                if schema is None:
                    raise StateError(f"PostgreSQL state database {self.where}: no schema to create tables in (its "
                                     "search_path names none that exists)")
                self.schema = str(schema)
                self._migrate(conn)
        except psycopg.Error as exc:
            raise StateError(f"cannot use the PostgreSQL state database {self.where}: {_reason(exc)}") from None
        self._pool: ConnectionPool[Any] = ConnectionPool(
            self._conninfo, kwargs={"autocommit": True, "row_factory": dict_row}, min_size=1,
            max_size=max(2, max_connections), timeout=CONNECT_TIMEOUT_S, name="fleetllm-state", open=True)

    def _migrate(self, conn: psycopg.Connection[Any]) -> None:
        key = lock_key("migrate", self.schema)
        for version in range(1, len(MIGRATIONS) + 1):
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (key,))
                conn.execute("CREATE TABLE IF NOT EXISTS fleetllm_schema (version INTEGER NOT NULL)")
                row = conn.execute("SELECT version FROM fleetllm_schema").fetchone()
                if row is None:
                    conn.execute("INSERT INTO fleetllm_schema (version) VALUES (0)")
                current = 0 if row is None else int(row[0])
                if current > len(MIGRATIONS):
                    raise StateError(f"state database {self.where} has schema version {current}, newer than "
                                     f"this fleetllm knows ({len(MIGRATIONS)}); upgrade fleetllm")
                if current >= version:
                    continue
                conn.execute(POSTGRESQL.ddl(MIGRATIONS[version - 1]).encode())
                conn.execute("UPDATE fleetllm_schema SET version = %s", (version,))

    @property
    def schema_version(self) -> int:
        return int(self.read("SELECT version FROM fleetllm_schema")[0]["version"])

    @contextmanager
    def transaction(self) -> Iterator[Tx]:
        try:
            with self._pool.connection() as conn, conn.transaction():
                yield Tx(conn.cursor(), POSTGRESQL)
        except psycopg.Error as exc:
            raise StateError(f"state database {self.where}: {_reason(exc)}") from None

    def read(self, statement: str, params: Sequence[object] = ()) -> list[Row]:
        try:
            with self._pool.connection() as conn:
                return Tx(conn.cursor(), POSTGRESQL).rows(statement, params)
        except psycopg.Error as exc:
            raise StateError(f"state database {self.where}: {_reason(exc)}") from None

    def pass_lock(self, lock_file: str | Path | None = None) -> AbstractContextManager[None]:
        """The advisory lock, on all machines; `lock_file` is for file-locked stores and unused here."""
        return self._advisory_lock(lock_key("reconcile", self.schema))

    @contextmanager
    def _advisory_lock(self, key: int) -> Iterator[None]:
        me = f"fleetllm-reconcile {socket.gethostname()} pid {os.getpid()}"
        try:
            conn = psycopg.connect(self._conninfo, autocommit=True, application_name=me[:63])
        except psycopg.Error as exc:
            raise StateError(f"cannot take the reconcile lock in {self.where}: {_reason(exc)}") from None
        with conn:
            if not conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()[0]:  # type: ignore[index]
                holder = _holder(conn, key)
                raise LockHeld(f"another reconcile pass holds the PostgreSQL advisory lock in {self.where}"
                               + (f" ({holder})" if holder else ""))
            try:
                yield
            finally:
                with contextlib.suppress(psycopg.Error):  # the session is gone, and the lock with it
                    conn.execute("SELECT pg_advisory_unlock(%s)", (key,))

    def close(self) -> None:
        self._pool.close()


def _holder(conn: psycopg.Connection[Any], key: int) -> str | None:
    """Who holds the advisory lock `key` (its application_name and since when), when visible."""
    unsigned = key & 0xFFFFFFFFFFFFFFFF
    row = conn.execute(
        "SELECT a.application_name, a.client_addr, a.backend_start FROM pg_locks l "
        "JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.granted "
        "AND l.classid = %s AND l.objid = %s AND l.objsubid = 1 "
        "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())",
        (unsigned >> 32, unsigned & 0xFFFFFFFF)).fetchone()
    if row is None or not row[0]:
        return None
    name, address, since = row
    return f"{name}" + (f" from {address}" if address else "") + (f", connected since {since:%Y-%m-%d %H:%M:%S}"
                                                                   if since else "")


def _reason(exc: psycopg.Error) -> str:
    """libpq's message without its trailing newline; libpq never puts the password in one."""
    return " ".join(str(exc).split())
