"""The notification ledger (adapters/state/notifications.py) on every engine: a claim is a
compare-and-swap, so of two processes deciding the same thing only one sends; migration 5 made it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetllm.adapters.state import open_store
from fleetllm.adapters.state.migrations import MIGRATIONS
from fleetllm.adapters.state.notifications import MemoryLedger, NotificationLedger, SqlLedger, ledger_for
from fleetllm.adapters.state.reconcile import MemoryStore
from fleetllm.adapters.state.sqlstore import SqlStateStore
from fleetllm.core.notify import Event, EventKind, decide

RENOTIFY = 60.0


@pytest.fixture(params=["memory", "sqlite", "postgresql"])
def ledgers(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[NotificationLedger, NotificationLedger]]:
    """Two views of one ledger, as two replicas (or two reconcile runs) have."""
    if request.param == "memory":
        one = MemoryLedger()
        yield one, one
        return
    url = f"sqlite:///{tmp_path / 'state.db'}" if request.param == "sqlite" else request.getfixturevalue("pg_url")
    first, second = open_store(url), open_store(url)
    assert first.schema_version == len(MIGRATIONS)
    yield SqlLedger(first.db), SqlLedger(second.db)
    first.close()
    second.close()


def test_one_of_two_deciders_wins_each_step(ledgers: tuple[NotificationLedger, NotificationLedger]) -> None:
    a, b = ledgers
    event = Event(EventKind.INVALID_COMMIT, "main", "bad head", fingerprint="1" * 40)
    seen_a, seen_b = a.condition(event.key), b.condition(event.key)
    assert seen_a is None and seen_b is None
    first_a, first_b = decide(seen_a, event, 10.0, RENOTIFY), decide(seen_b, event, 10.0, RENOTIFY)
    assert first_a is not None and first_b is not None
    assert a.claim(first_a.previous, first_a.after) is True
    assert b.claim(first_b.previous, first_b.after) is False  # the other replica sends it
    stored = b.condition(event.key)
    assert stored is not None and stored.fingerprint == "1" * 40 and stored.version == 0
    assert decide(stored, event, 20.0, RENOTIFY) is None  # deduplicated
    assert list(a.open_conditions("invalid_commit")) == [event.key]
    assert a.open_conditions("pass_failed") == {}

    newer = Event(EventKind.INVALID_COMMIT, "main", "a newer bad head", fingerprint="2" * 40)
    change_a, change_b = decide(stored, newer, 30.0, RENOTIFY), decide(stored, newer, 30.0, RENOTIFY)
    assert change_a is not None and change_b is not None
    assert b.claim(change_b.previous, change_b.after) is True
    assert a.claim(change_a.previous, change_a.after) is False
    changed = a.condition(event.key)
    assert changed is not None and (changed.fingerprint, changed.version, changed.first_at) == ("2" * 40, 1, 10.0)

    cleared = decide(changed, Event.resolved(EventKind.INVALID_COMMIT, "main"), 40.0, RENOTIFY)
    assert cleared is not None and cleared.after is None
    assert a.claim(cleared.previous, None) is True
    assert b.claim(cleared.previous, None) is False
    assert a.condition(event.key) is None and b.condition(event.key) is None


def test_a_store_gets_the_sql_ledger_and_memory_a_memory_one(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 's.db'}")
    try:
        assert isinstance(store, SqlStateStore)
        assert isinstance(ledger_for(store), SqlLedger)
    finally:
        store.close()
    assert isinstance(ledger_for(MemoryStore()), MemoryLedger)
