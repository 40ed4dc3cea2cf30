"""Reconcile pass records on both engines: the newest keep their per-server detail, older ones their
summary, and only the newest KEEP_PASSES are kept; the control plane and the reconciler read the same rows."""

from __future__ import annotations

import dataclasses

import pytest

from fleetllm.adapters.state import open_reconcile_state as open_reconciler_store
from fleetllm.adapters.state import sqlstore
from fleetllm.adapters.state.sqlstore import SqlStateStore
from fleetllm.adapters.state.store import DETAILED_PASSES
from tests.pages.test_records import DETAILED


def test_the_store_keeps_detail_for_the_newest_passes_only(store: SqlStateStore,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    for n in range(DETAILED_PASSES + 2):
        store.record_pass(dataclasses.replace(DETAILED, started_at=float(n)))
    passes = store.recent_passes(100)
    assert [p.started_at for p in passes] == [float(n) for n in reversed(range(DETAILED_PASSES + 2))]
    assert [p.detailed for p in passes] == [True] * DETAILED_PASSES + [False, False]
    assert passes[-1] == dataclasses.replace(DETAILED, started_at=0.0).summary()
    monkeypatch.setattr(sqlstore, "KEEP_PASSES", 3)
    store.record_pass(DETAILED)
    assert len(store.recent_passes(100)) == 3


def test_the_reconcilers_store_and_the_control_planes_are_one(store_url: str, store: SqlStateStore) -> None:
    reconciler_side = open_reconciler_store(store_url)
    try:
        reconciler_side.record_pass(DETAILED)
    finally:
        reconciler_side.close()
    assert store.recent_passes() == [DETAILED]
