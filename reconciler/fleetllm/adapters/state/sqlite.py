"""The embedded engine: one SQLite file in WAL mode (the default state store).

One connection shared by the process's threads behind a lock; other processes (the CLI, a reconcile
job) can read concurrently thanks to WAL, and writers wait up to 30 s for each other. The schema
version is SQLite's `PRAGMA user_version`; a reconcile pass is single-flight through a file lock
beside the database file.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

from fleetllm.adapters.state.dialect import SQLITE, Row, Tx, dict_rows
from fleetllm.adapters.state.locks import default_lock_path, file_lock
from fleetllm.adapters.state.migrations import MIGRATIONS
from fleetllm.errors import StateError


class SqliteDatabase:
    """`path` None: an in-memory database (tests)."""

    dialect = SQLITE

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.where = str(path) if path is not None else ":memory:"
        self._lock = threading.Lock()
        try:
            if path is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(str(path) if path else ":memory:", isolation_level=None,
                                       check_same_thread=False, timeout=30.0)
        except (OSError, sqlite3.Error) as exc:
            raise StateError(f"cannot open the state database {self.where}: {exc}") from None
        self._db.row_factory = dict_rows
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute("PRAGMA foreign_keys=ON")
            self.migrate()
        except sqlite3.Error as exc:
            self._db.close()
            raise StateError(f"state database {self.where}: {exc}") from None

    @property
    def schema_version(self) -> int:
        version: int = self._db.execute("PRAGMA user_version").fetchone()["user_version"]
        return version

    def migrate(self) -> None:
        with self._lock:
            current = self.schema_version
            if current > len(MIGRATIONS):
                raise StateError(f"state database {self.where} has schema version {current}, newer than this "
                                 f"fleetllm knows ({len(MIGRATIONS)}); upgrade fleetllm")
            for version in range(current + 1, len(MIGRATIONS) + 1):
                # One transaction per migration, the version bump included: a crash leaves it unapplied.
                self._db.executescript(f"BEGIN IMMEDIATE;\n{SQLITE.ddl(MIGRATIONS[version - 1])}\n"
                                       f"PRAGMA user_version = {version};\nCOMMIT;")

    @contextmanager
    def transaction(self) -> Iterator[Tx]:
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    yield Tx(self._db.cursor(), SQLITE)
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
                self._db.execute("COMMIT")
            except sqlite3.Error as exc:
                raise StateError(f"state database {self.where}: {exc}") from None

    def read(self, statement: str, params: Sequence[object] = ()) -> list[Row]:
        with self._lock:
            try:
                return Tx(self._db.cursor(), SQLITE).rows(statement, params)
            except sqlite3.Error as exc:
                raise StateError(f"state database {self.where}: {exc}") from None

    def pass_lock(self, lock_file: str | Path | None = None) -> AbstractContextManager[None]:
        return file_lock(lock_file or default_lock_path(self.path))

    def close(self) -> None:
        with self._lock:
            self._db.close()
