"""The operator controls in the state store (migration 5), on SQLite and PostgreSQL: what is in force,
one taker per sync request, idempotent suspend/resume/unpin, and the audit trail of every action."""

from __future__ import annotations

import pytest

from fleetllm.adapters.state import control, open_store
from fleetllm.adapters.state.control import pin_of
from fleetllm.adapters.state.sqlstore import SqlStateStore
from fleetllm.core.control import MAX_REASON_CHARS, NOTHING, ControlAction

REV = "a" * 40


def test_nothing_in_force_on_a_new_store(store: SqlStateStore) -> None:
    assert store.control() == NOTHING
    assert pin_of(store) is None
    assert store.take_sync_request() is None
    assert store.control_audit() == []


def test_suspend_resume_pin_unpin_with_their_audit(store: SqlStateStore) -> None:
    assert store.suspend("admin:aaa", 10.0, "LiteLLM upgrade")
    assert not store.suspend("admin:bbb", 11.0, "again")  # the first one's who/when/why stay
    state = store.control()
    assert state.suspended is not None
    assert (state.suspended.actor, state.suspended.at, state.suspended.reason) == ("admin:aaa", 10.0, "LiteLLM upgrade")
    store.pin(REV, "admin:aaa", 12.0, "bad model")
    pin = pin_of(store)
    assert pin is not None and (pin.revision, pin.actor, pin.at, pin.reason) == (REV, "admin:aaa", 12.0, "bad model")
    assert store.resume("admin:ccc", 13.0)
    assert not store.resume("admin:ccc", 14.0)
    assert store.unpin("admin:ccc", 15.0, "fixed")
    assert not store.unpin("admin:ccc", 16.0)
    assert store.control() == NOTHING
    audit = store.control_audit()
    assert [(e.action, e.actor, e.at, e.revision) for e in audit] == [
        (ControlAction.UNPIN, "admin:ccc", 15.0, None), (ControlAction.RESUME, "admin:ccc", 13.0, None),
        (ControlAction.PIN, "admin:aaa", 12.0, REV), (ControlAction.SUSPEND, "admin:aaa", 10.0, None)]
    assert audit[0].reason == "fixed"


def test_a_sync_request_is_taken_once_even_by_two_stores(store_url: str) -> None:
    first, second = open_store(store_url), open_store(store_url)
    try:
        first.request_sync("admin:aaa", 20.0, "now please")
        assert first.control().sync is not None
        taken = second.take_sync_request()
        assert taken is not None and (taken.actor, taken.reason) == ("admin:aaa", "now please")
        assert first.take_sync_request() is None
        assert second.control().sync is None
        assert [e.action for e in first.control_audit()] == [ControlAction.SYNC]
    finally:
        first.close()
        second.close()


def test_reasons_are_one_bounded_line(store: SqlStateStore) -> None:
    store.suspend("admin:aaa", 1.0, "line one\nline two\x1b[31m" + "x" * 2000)
    suspended = store.control().suspended
    assert suspended is not None
    assert "\n" not in suspended.reason and "\x1b" not in suspended.reason
    assert len(suspended.reason) == MAX_REASON_CHARS


def test_a_burst_of_sync_requests_never_pushes_out_a_suspension_or_a_pin(store: SqlStateStore,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(control, "KEEP_AUDIT", 5)
    assert store.suspend("admin:aaa", 1.0, "incident")
    store.pin(REV, "admin:aaa", 2.0, "known good")
    for i in range(30):
        store.request_sync(f"token:ci{i}", 10.0 + i)
    audit = store.control_audit(limit=100)
    kept = [(e.action, e.at) for e in audit if e.action is not ControlAction.SYNC]
    assert kept == [(ControlAction.PIN, 2.0), (ControlAction.SUSPEND, 1.0)]
    assert [e.at for e in audit if e.action is ControlAction.SYNC] == [39.0, 38.0, 37.0, 36.0, 35.0]
