"""The reconciler's state (its Protocol, reconciler/fleetllm/adapters/state/reconcile.py) on every store: in memory, and
the control plane's store on SQLite and on PostgreSQL, which is one object for both."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetllm.adapters.state import open_reconcile_state
from fleetllm.adapters.state.passes import ActionRecord, PassRecord
from fleetllm.adapters.state.reconcile import MemoryStore, ReconcileState
from fleetllm.adapters.state.records import BoxApi, FetchRecord
from fleetllm.adapters.state.sqlstore import SqlStateStore
from fleetllm.core.boxreport import BoxReport
from fleetllm.core.fleet.jsonvalue import freeze_mapping
from fleetllm.core.judge.plan import PendingDelete
from fleetllm.core.judge.verdict import ServerHistory
from fleetllm_contract.report import ReportOutcome

RECORD = PassRecord(100.0, 1.5, "a" * 40, "apply", {"Healthy": 2, "Down": 1},
                    (ActionRecord("delete", "fleetllm:b:8001", False, "failed", "HTTP 503"),), ("vast listing: x",))


@pytest.fixture(params=["memory", "sqlite", "postgresql"])
def reconcile_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ReconcileState]:
    if request.param == "memory":
        yield MemoryStore()
        return
    url = f"sqlite:///{tmp_path / 'state.db'}" if request.param == "sqlite" else request.getfixturevalue("pg_url")
    store = open_reconcile_state(url)
    yield store
    assert isinstance(store, SqlStateStore)
    store.close()


REPORT = BoxReport("c", 30.0, "127.0.0.1", "r" * 40, "1", ReportOutcome.FIT_FAILED,
                   freeze_mapping({"servers": [{"name": "m", "digest": "sha256:1"}]}))


def record_box_facts(store: ReconcileState) -> None:
    """What the control plane records: two config fetches of b, a report of c."""
    if isinstance(store, MemoryStore):
        store.record_fetch("b", 10.0)
        store.record_fetch("b", 20.0)
        store.record_report("c", REPORT)
        return
    assert isinstance(store, SqlStateStore)  # the control plane's methods on the same object
    for at in (10.0, 20.0):
        store.record_fetch(FetchRecord(at, BoxApi.CONFIG, 200, "127.0.0.1", "b", None, "b", "r" * 40))
    store.record_fetch(FetchRecord(25.0, BoxApi.CONFIG, 404, "127.0.0.1", "b", None, "b", None))
    store.record_report(REPORT, 20)


def test_store_round_trips(reconcile_store: ReconcileState) -> None:
    store = reconcile_store
    record_box_facts(store)
    facts = store.box_facts()
    assert facts["b"].fetched_at == 20.0
    assert facts["c"].report == REPORT
    assert facts["c"].report.server_digests() == {"m": "sha256:1"}
    history = {("b", 8001): ServerHistory(1.0, up=True, ever_up=True, recent="101", last_healthy=2.0)}
    store.save_histories(history)
    assert store.histories() == history
    store.save_histories({})
    assert store.histories() == {}
    pending = {"x": PendingDelete("x", 2, "HTTP 503", 5.0)}
    store.save_pending_deletes(pending)
    assert store.pending_deletes() == pending
    store.record_pass(RECORD)
    store.record_pass(PassRecord(200.0, 0.5, "b" * 40, "apply", {}))
    assert [p.started_at for p in store.recent_passes(5)] == [200.0, 100.0]
    assert store.recent_passes(5)[1] == RECORD
    assert store.recorded_fleet_id() is None  # a fresh store: no history of a fleet id
    store.record_fleet_id("git-0123456789ab", "a" * 40, 300.0)
    store.record_fleet_id("git-0123456789ab", "b" * 40, 400.0)  # unchanged: nothing written
    assert store.recorded_fleet_id() == "git-0123456789ab"
    store.record_fleet_id("blue", "c" * 40, 500.0)
    assert store.recorded_fleet_id() == "blue"


def test_passes_survive_reopen(store_url: str) -> None:
    first = open_reconcile_state(store_url)
    first.record_pass(RECORD)
    assert isinstance(first, SqlStateStore)
    first.close()
    again = open_reconcile_state(store_url)
    assert isinstance(again, SqlStateStore)
    try:
        assert again.recent_passes(1) == [RECORD]
        assert again.recorded_fleet_id() is None
        again.record_fleet_id("git-0123456789ab", "a" * 40, 300.0)
    finally:
        again.close()
    third = open_reconcile_state(store_url)
    assert isinstance(third, SqlStateStore)
    try:
        assert third.recorded_fleet_id() == "git-0123456789ab"  # the fleet's history outlives the process
    finally:
        third.close()


def test_open_store_urls(tmp_path: Path) -> None:
    assert isinstance(open_reconcile_state(None), MemoryStore)
    assert isinstance(open_reconcile_state("memory:"), MemoryStore)
    plain = open_reconcile_state(str(tmp_path / "plain.db"))  # a bare path is a SQLite file
    assert isinstance(plain, SqlStateStore)
    assert plain.backend == "sqlite"
    plain.close()
    with pytest.raises(ValueError, match="unsupported state URL"):
        open_reconcile_state("mysql://x/y")
