"""A pass's mode on both engines: a suspended pass is kept as "suspended" (not a dry run's "plan"), and the
records of earlier versions (modes "plan" and "apply", written without any newer field) read as they were.
The column is free text (migration 2), so no migration is needed."""

from __future__ import annotations

import dataclasses
import json

from fleetllm.adapters.state.passes import PassMode, PassRecord
from fleetllm.adapters.state.sqlstore import SqlStateStore
from tests.pages.test_records import DETAILED


def test_each_mode_is_kept_and_read_back(store: SqlStateStore) -> None:
    for n, mode in enumerate(PassMode):
        store.record_pass(dataclasses.replace(DETAILED, started_at=float(n), mode=mode.value))
    passes = store.recent_passes(10)
    assert [p.mode for p in passes] == ["suspended", "plan", "apply"]
    assert [p.written for p in passes] == [False, False, True]
    rows = store.db.read("SELECT mode FROM reconcile_pass ORDER BY seq")
    assert [r["mode"] for r in rows] == ["apply", "plan", "suspended"]


def test_an_old_record_reads_as_it_was(store: SqlStateStore) -> None:
    old = {"started_at": 1.0, "duration_s": 0.5, "revision": "a" * 40, "mode": "plan", "verdicts": {"Healthy": 1},
           "actions": [{"kind": "create", "id": "fleetllm:127.0.0.2:8001", "ok": True,
                        "outcome": "planned, not applied"}]}
    with store.db.transaction() as tx:
        tx.execute("INSERT INTO reconcile_pass (started_at, revision, mode, ok, record) VALUES (?, ?, ?, ?, ?)",
                   (1.0, "a" * 40, "plan", 1, json.dumps(old)))
    (record,) = store.recent_passes(1)
    assert record == PassRecord.from_json(old) and record.mode == PassMode.PLAN and not record.written
