"""The control plane's overdue-pass notification (server/notifywatch.py through Runtime.watch_passes):
on the real runtime and state store, a receiver on loopback; the clock is the runtime's."""

from __future__ import annotations

from collections.abc import Callable

from fleetllm.adapters.state.passes import PassRecord
from fleetllm.server.runtime import Runtime
from tests.notify.receiver import receiving

EVENTS = ["pass_failed"]


def test_an_overdue_pass_is_notified_once_and_resolved(make_runtime: Callable[..., Runtime]) -> None:
    with receiving() as receiver:
        runtime = make_runtime(litellm={"url": "http://127.0.0.1:9", "master_key": "${env:ADMIN}"},
                               notifications={"targets": [{"name": "ops", "kind": "webhook",
                                                           "url": receiver.url + "/hook", "events": EVENTS}]})
        clock = runtime.clock
        runtime.store.record_pass(PassRecord(clock(), 0.5, "a" * 40, "apply", {}))
        runtime.watch_passes()  # in time: nothing
        clock.now += 181.0  # type: ignore[attr-defined]  # two intervals (60 s) and a minute, and a second
        runtime.watch_passes()
        runtime.watch_passes()  # still overdue: not sent again
        (late,) = receiver.wait_for(1)
        runtime.store.record_pass(PassRecord(clock(), 0.5, "a" * 40, "apply", {}))
        runtime.watch_passes()
        receiver.wait_for(2)
        assert runtime.notifier.close(10)
    assert (late.body["kind"], late.body["subject"], late.body["status"]) == ("pass_failed", "overdue", "firing")
    assert "181 s ago" in late.body["summary"] and late.body["details"]["interval_s"] == 60
    assert [r.body["status"] for r in receiver.received] == ["firing", "resolved"]


def test_no_reconciler_expected_no_overdue(make_runtime: Callable[..., Runtime]) -> None:
    with receiving() as receiver:
        runtime = make_runtime(notifications={"targets": [{"name": "ops", "kind": "webhook",
                                                           "url": receiver.url + "/hook", "events": EVENTS}]},
                               reconcile={"enabled": False})
        runtime.clock.now += 10_000  # type: ignore[attr-defined]
        runtime.watch_passes()  # the reconciler is switched off: no pass is expected (without LiteLLM one is: it
        # runs the rollouts, test_an_overdue_pass_without_litellm_is_notified)
        assert runtime.notifier.close(10)
        assert receiver.received == []


def test_an_overdue_pass_without_litellm_is_notified(make_runtime: Callable[..., Runtime]) -> None:
    with receiving() as receiver:
        runtime = make_runtime(notifications={"targets": [{"name": "ops", "kind": "webhook",
                                                           "url": receiver.url + "/hook", "events": EVENTS}]})
        runtime.clock.now += 10_000  # type: ignore[attr-defined]
        runtime.watch_passes()  # no litellm section: the boxes route, and the reconciler runs their rollouts
        (late,) = receiver.wait_for(1)
        assert runtime.notifier.close(10)
    assert (late.body["kind"], late.body["subject"], late.body["status"]) == ("pass_failed", "overdue", "firing")
