"""The operator controls in the state store (fleetllm.core.control): sync requests, the suspension, the
pin, and their audit trail, on SQLite or PostgreSQL (tables of migration 5).

`control_state` holds one row per control in force (`suspend`, `pin`, `sync`); every action also
appends a row to `control_audit` in the same transaction. A sync request is taken with one DELETE, so
of several reconcile loops sharing the store exactly one runs the pass asked for.

`ControlTables` is mixed into SqlStateStore (sqlstore.py); `ControlStore` is its Protocol, and
`pin_of(store)` the one lookup of the pin that the control plane and the reconciler use.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Protocol

from fleetllm.adapters.state.dialect import Row, Tx
from fleetllm.core.control import (
    NOTHING,
    ControlAction,
    ControlEvent,
    ControlState,
    Pin,
    Suspension,
    SyncRequest,
    clean_reason,
)

KEEP_AUDIT = 10_000  # audit rows kept of each class (sync requests; every other action); the oldest go beyond it
SUSPEND, PIN, SYNC = "suspend", "pin", "sync"
_INSERT = "INSERT INTO control_state (name, revision, actor, reason, at) VALUES (?, ?, ?, ?, ?) ON CONFLICT (name) "
_INSERT_IF_ABSENT = _INSERT + "DO NOTHING"
_UPSERT = _INSERT + ("DO UPDATE SET revision = excluded.revision, actor = excluded.actor, reason = excluded.reason, "
                     "at = excluded.at")


class ControlReader(Protocol):
    """What a reconcile loop reads (and takes) of the controls."""

    def control(self) -> ControlState: ...

    def take_sync_request(self) -> SyncRequest | None:
        """The pending sync request, removed (None when there is none): one taker per request."""
        ...


class ControlStore(ControlReader, Protocol):
    def request_sync(self, actor: str, at: float, reason: str = "") -> None: ...

    def suspend(self, actor: str, at: float, reason: str = "") -> bool:
        """Suspend the fleet; False when it already was (the first suspension's who/when/why stay)."""
        ...

    def resume(self, actor: str, at: float, reason: str = "") -> bool:
        """End the suspension; False when there was none."""
        ...

    def pin(self, revision: str, actor: str, at: float, reason: str = "") -> None:
        """Pin (or re-pin) the fleet to `revision` (checked by the caller: in the branch's history, valid)."""
        ...

    def record_control(self, action: ControlAction, actor: str, at: float, reason: str = "",
                       revision: str | None = None) -> None:
        """Append to the audit trail an action kept elsewhere (a rollout request: the rollouts table)."""
        ...

    def unpin(self, actor: str, at: float, reason: str = "") -> bool:
        """Remove the pin; False when there was none."""
        ...

    def control_audit(self, limit: int = 50) -> list[ControlEvent]:
        """Newest first."""
        ...


def pin_of(store: ControlReader) -> Pin | None:
    """The pin in force, if any: the one lookup of it (the served revision, the reconciler's intended
    revision and a rollout's target all follow it)."""
    return store.control().pin


def _state(rows: list[Row]) -> ControlState:
    by_name = {r["name"]: r for r in rows}
    s, p, y = by_name.get(SUSPEND), by_name.get(PIN), by_name.get(SYNC)
    return ControlState(
        suspended=Suspension(s["actor"], s["at"], s["reason"]) if s else None,
        pin=Pin(p["revision"], p["actor"], p["at"], p["reason"]) if p and p["revision"] else None,
        sync=SyncRequest(y["actor"], y["at"], y["reason"]) if y else None)


class _Database(Protocol):  # the part of sqlstore.Database used here
    def transaction(self) -> AbstractContextManager[Tx]: ...

    def read(self, statement: str, params: tuple[object, ...] = ()) -> list[Row]: ...


class ControlTables:
    """ControlStore over the store's database (mixed into SqlStateStore, which sets `db`)."""

    db: _Database

    def control(self) -> ControlState:
        rows = self.db.read("SELECT name, revision, actor, reason, at FROM control_state")
        return _state(rows) if rows else NOTHING

    def _act(self, action: ControlAction, actor: str, at: float, reason: str, *, upsert: str | None = None,
             remove: str | None = None, revision: str | None = None, only_if_absent: bool = False) -> bool:
        reason = clean_reason(reason)
        with self.db.transaction() as tx:
            if remove is not None and tx.execute("DELETE FROM control_state WHERE name = ?", (remove,)) == 0:
                return False
            if upsert is not None:
                written = tx.execute(_INSERT_IF_ABSENT if only_if_absent else _UPSERT,
                                     (upsert, revision, actor, reason, at))
                if written == 0:  # only_if_absent, and it was there: one statement, so no race between two
                    return False
            tx.execute("INSERT INTO control_audit (at, action, actor, reason, revision) VALUES (?, ?, ?, ?, ?)",
                       (at, action.value, actor, reason, revision))
            # Sync requests (frequent, harmless) and the other actions (suspend, pin, rollout requests) are
            # kept apart: a burst of syncs pushes out only older syncs, never a suspension's or a pin's record.
            same = "action = ?" if action is ControlAction.SYNC else "action <> ?"
            tx.execute(f"DELETE FROM control_audit WHERE {same} AND id <= (SELECT id FROM control_audit "  # noqa: S608
                       f"WHERE {same} ORDER BY id DESC LIMIT 1 OFFSET ?)",  # (two fixed strings)
                       (ControlAction.SYNC.value, ControlAction.SYNC.value, KEEP_AUDIT))
        return True

    def request_sync(self, actor: str, at: float, reason: str = "") -> None:
        self._act(ControlAction.SYNC, actor, at, reason, upsert=SYNC)

    def take_sync_request(self) -> SyncRequest | None:
        with self.db.transaction() as tx:
            rows = tx.rows("SELECT actor, reason, at FROM control_state WHERE name = ?", (SYNC,))
            if not rows or tx.execute("DELETE FROM control_state WHERE name = ?", (SYNC,)) == 0:
                return None
        return SyncRequest(rows[0]["actor"], rows[0]["at"], rows[0]["reason"])

    def suspend(self, actor: str, at: float, reason: str = "") -> bool:
        return self._act(ControlAction.SUSPEND, actor, at, reason, upsert=SUSPEND, only_if_absent=True)

    def resume(self, actor: str, at: float, reason: str = "") -> bool:
        return self._act(ControlAction.RESUME, actor, at, reason, remove=SUSPEND)

    def pin(self, revision: str, actor: str, at: float, reason: str = "") -> None:
        self._act(ControlAction.PIN, actor, at, reason, upsert=PIN, revision=revision)

    def unpin(self, actor: str, at: float, reason: str = "") -> bool:
        return self._act(ControlAction.UNPIN, actor, at, reason, remove=PIN)

    def record_control(self, action: ControlAction, actor: str, at: float, reason: str = "",
                       revision: str | None = None) -> None:
        self._act(action, actor, at, reason, revision=revision)

    def control_audit(self, limit: int = 50) -> list[ControlEvent]:
        rows = self.db.read("SELECT at, action, actor, reason, revision FROM control_audit ORDER BY id DESC LIMIT ?",
                            (limit,))
        return [ControlEvent(r["at"], ControlAction(r["action"]), r["actor"], r["reason"], r["revision"])
                for r in rows]
