"""The notification ledger: per open condition, what was last sent (fleetllm.core.notify.Condition).

Kept in the state store (table notification_conditions, migration 5) so that several control-plane
replicas and one-off `fleetllm reconcile --once` runs send a condition once: every write is a
compare-and-swap on the row's version (`claim`), and only the process whose claim succeeds sends.
`MemoryLedger` for a run without a store (the environment-only settings) and for tests.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Protocol

from fleetllm.adapters.state.dialect import Row
from fleetllm.adapters.state.sqlstore import Database, SqlStateStore
from fleetllm.core.notify import Condition

MAX_SUMMARY = 2000  # characters of a summary kept


class NotificationLedger(Protocol):
    def open_conditions(self, kind: str) -> dict[str, Condition]:
        """The open conditions of one kind, by key."""
        ...

    def condition(self, key: str) -> Condition | None: ...

    def claim(self, previous: Condition | None, after: Condition | None) -> bool:
        """Replace `previous` (None: no row) with `after` (None: delete), only if the row is still
        `previous` (its version). True when this caller won and must send."""
        ...


def _condition(row: Row) -> Condition:
    return Condition(row["key"], row["kind"], row["subject"], row["fingerprint"], row["summary"], row["first_at"],
                     row["sent_at"], row["version"])


class SqlLedger:
    def __init__(self, database: Database) -> None:
        self.db = database

    def open_conditions(self, kind: str) -> dict[str, Condition]:
        rows = self.db.read("SELECT * FROM notification_conditions WHERE kind = ?", (kind,))
        return {r["key"]: _condition(r) for r in rows}

    def condition(self, key: str) -> Condition | None:
        rows = self.db.read("SELECT * FROM notification_conditions WHERE key = ?", (key,))
        return _condition(rows[0]) if rows else None

    def claim(self, previous: Condition | None, after: Condition | None) -> bool:
        with self.db.transaction() as tx:
            if after is None:
                if previous is None:
                    return False
                return tx.execute("DELETE FROM notification_conditions WHERE key = ? AND version = ?",
                                  (previous.key, previous.version)) == 1
            values = (after.fingerprint, after.summary[:MAX_SUMMARY], after.first_at, after.sent_at)
            if previous is None:
                return tx.execute("INSERT INTO notification_conditions (key, kind, subject, fingerprint, summary, "
                                  "first_at, sent_at, version) VALUES (?, ?, ?, ?, ?, ?, ?, 0) "
                                  "ON CONFLICT (key) DO NOTHING",
                                  (after.key, after.kind, after.subject, *values)) == 1
            return tx.execute("UPDATE notification_conditions SET fingerprint = ?, summary = ?, first_at = ?, "
                              "sent_at = ?, version = version + 1 WHERE key = ? AND version = ?",
                              (*values, previous.key, previous.version)) == 1


class MemoryLedger:
    def __init__(self) -> None:
        self._rows: dict[str, Condition] = {}
        self._lock = threading.Lock()

    def open_conditions(self, kind: str) -> dict[str, Condition]:
        with self._lock:
            return {k: c for k, c in self._rows.items() if c.kind == kind}

    def condition(self, key: str) -> Condition | None:
        with self._lock:
            return self._rows.get(key)

    def claim(self, previous: Condition | None, after: Condition | None) -> bool:
        key = previous.key if previous is not None else after.key if after is not None else None
        if key is None:
            return False
        with self._lock:
            current = self._rows.get(key)
            if (current.version if current else None) != (previous.version if previous else None):
                return False
            if after is None:
                del self._rows[key]
            else:
                self._rows[key] = replace(after, version=0 if previous is None else previous.version + 1)
            return True


def ledger_for(store: object) -> NotificationLedger:
    """The ledger of a state store: its table when it is the SQL store, else one in memory."""
    return SqlLedger(store.db) if isinstance(store, SqlStateStore) else MemoryLedger()
