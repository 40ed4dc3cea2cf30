"""The SQLite state store: migrations, WAL, each record kind, caps."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from reconciler.fleet.jsonvalue import freeze_mapping
from reconciler.state import (
    Approval,
    BoxReport,
    Endpoint,
    FetchRecord,
    Outcome,
    Sighting,
    StateError,
    open_store,
)
from reconciler.state.sqlite import MIGRATIONS, SQLiteStateStore
from reconciler.state.store import sqlite_path


def test_url_forms(tmp_path: Path) -> None:
    assert sqlite_path("sqlite:///rel/db.sqlite3", tmp_path) == tmp_path / "rel/db.sqlite3"
    assert sqlite_path("sqlite:////abs/db", tmp_path) == Path("/abs/db")
    assert sqlite_path("sqlite:///:memory:") is None
    with pytest.raises(StateError, match="only sqlite"):
        sqlite_path("postgresql://db/x")


def test_created_migrated_and_wal(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "state.db"
    store = open_store(f"sqlite:///{path}")
    store.close()
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"fetches", "attention", "box_reports", "approvals"} <= tables
    db.close()
    open_store(f"sqlite:///{path}").close()  # reopening migrates nothing and keeps working


def test_newer_schema_refused(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version = {len(MIGRATIONS) + 1}")
    db.close()
    with pytest.raises(StateError, match="newer than this llmfleet"):
        SQLiteStateStore(path)


def test_unwritable_location(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(StateError, match="cannot open"):
        SQLiteStateStore(blocker / "state.db")


def fetch(at: float, box: str | None, status: int = 200, endpoint: Endpoint = Endpoint.CONFIG) -> FetchRecord:
    return FetchRecord(at=at, endpoint=endpoint, status=status, peer="192.0.2.1", box=box, revision="r")


def test_fetch_log() -> None:
    store = SQLiteStateStore(None)
    for i, (box, status) in enumerate([("a", 200), ("b", 200), ("a", 404), ("a", 200), (None, 403)]):
        store.record_fetch(fetch(float(i), box, status))
    store.record_fetch(fetch(9.0, "b", 200, Endpoint.REPORT))
    assert [r.at for r in store.recent_fetches(limit=3)] == [9.0, 4.0, 3.0]
    assert [r.at for r in store.recent_fetches(box="a")] == [3.0, 2.0, 0.0]
    served = store.last_config_served()
    assert {box: r.at for box, r in served.items()} == {"a": 3.0, "b": 1.0}
    assert store.prune(keep_fetches=2) == 4
    assert [r.at for r in store.recent_fetches()] == [9.0, 4.0]


def test_attention_list_is_bounded_lru() -> None:
    store = SQLiteStateStore(None)
    assert store.note_unknown(Sighting("x", 1.0, "192.0.2.1", "x"), max_entries=2) == 0
    store.note_unknown(Sighting("y", 2.0, "192.0.2.2"), max_entries=2)
    store.note_unknown(Sighting("x", 3.0, "192.0.2.3", "x", "198.51.100.1"), max_entries=2)
    entries = store.attention()
    assert [(e.box, e.count, e.first_seen, e.last_seen, e.peer) for e in entries] == [
        ("x", 2, 1.0, 3.0, "192.0.2.3"), ("y", 1, 2.0, 2.0, "192.0.2.2")]
    assert entries[0].forwarded_for == "198.51.100.1"
    assert store.note_unknown(Sighting("z", 4.0, "192.0.2.4"), max_entries=2) == 1
    assert [e.box for e in store.attention()] == ["z", "x"]  # y was least recently seen
    store.forget("x")
    assert store.attention_size() == 1


def test_reports_keep_latest_per_box() -> None:
    store = SQLiteStateStore(None)
    for i in range(5):
        body = {"revision": f"r{i}", "servers": [{"name": "s", "digest": f"d{i}"}]}
        store.record_report(BoxReport("a", float(i), "192.0.2.1", f"r{i}", "0.1", Outcome.INSTALLED,
                                      freeze_mapping(body)), keep=3)
    store.record_report(BoxReport("b", 9.0, "192.0.2.2", "rb", "0.1", Outcome.FIT_FAILED), keep=3)
    assert [r.revision for r in store.report_history("a")] == ["r4", "r3", "r2"]
    latest = store.latest_reports()
    assert latest["a"].server_digests() == {"s": "d4"}
    assert latest["b"].outcome is Outcome.FIT_FAILED


def test_approvals() -> None:
    store = SQLiteStateStore(None)
    store.record_approval(Approval(1.0, "h", ("m1", "m2"), "approve/h", "c" * 40, "b" * 40, "admin:abc"))
    assert store.approvals() == [Approval(1.0, "h", ("m1", "m2"), "approve/h", "c" * 40, "b" * 40, "admin:abc")]
