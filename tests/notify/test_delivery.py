"""The sender (adapters/notify.py) against a real receiver on loopback: what is sent, to whom, with
which headers; retried on 503 and not on 4xx; deduplicated through the ledger; emit never waits on a
slow or unreachable receiver; a full queue drops its oldest; no secret in any log line."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from prometheus_client import CollectorRegistry

from fleetllm.adapters.notify import Delivery, Notifier
from fleetllm.adapters.state.notifications import MemoryLedger
from fleetllm.core.notify import Event, EventKind, Target, TargetKind
from fleetllm.core.secret import Secret
from fleetllm.demo.procs import free_port
from tests.notify.receiver import Receiver, receiving
from tests.server.conftest import LogCapture

BEARER = "notify-bearer-Xq93LmZ7"
HEADER_TOKEN = "notify-header-Pw28VbN4"
SLACK_PATH = "/services/T000/B000/slack-secret-Kd83Hf"
ALL = frozenset(EventKind)


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


def notifier(targets: list[Target], *, attempts: int = 3, queue_size: int = 100, timeout_s: float = 5.0,
             ledger: MemoryLedger | None = None) -> tuple[Notifier, CollectorRegistry]:
    registry = CollectorRegistry()
    delivery = Delivery(renotify_s=3600.0, timeout_s=timeout_s, attempts=attempts, queue_size=queue_size,
                        send_resolved=True)
    return Notifier(targets, delivery, ledger or MemoryLedger(), component="control-plane", instance="test",
                    registry=registry), registry


def webhook(receiver: Receiver, name: str = "ops", events: frozenset[EventKind] = ALL) -> Target:
    return Target(name, TargetKind.WEBHOOK, Secret(receiver.url + "/hook", "the url"), events,
                  Secret(BEARER, "${env:B}"), ("X-Token", Secret(HEADER_TOKEN, "${env:H}")))


def slack(receiver: Receiver) -> Target:
    return Target("chat", TargetKind.SLACK, Secret(receiver.url + SLACK_PATH, "${env:SLACK}"),
                  frozenset({EventKind.MODEL_WITHOUT_SERVERS}))


@pytest.fixture
def logs() -> Iterator[LogCapture]:
    import logging

    from fleetllm.logs import setup_logging

    capture = LogCapture()
    setup_logging(capture.stream, logging.INFO)
    yield capture
    setup_logging()


def test_each_target_gets_what_it_wants_with_its_headers(logs: LogCapture) -> None:
    with receiving() as receiver:
        sender, registry = notifier([webhook(receiver), slack(receiver)])
        sender.emit(Event(EventKind.ROLLOUT_HALTED, "r-7", "rollout r-7 halted at step 2: canary Down",
                          details={"rollout": "r-7", "step": 2}))
        sender.settle(EventKind.MODEL_WITHOUT_SERVERS, [Event(EventKind.MODEL_WITHOUT_SERVERS, "tiny-a", "none")])
        hooked = receiver.wait_for(2, "/hook")
        (chat,) = receiver.wait_for(1, SLACK_PATH)
        assert sender.close(5)
    bodies = {r.body["kind"]: r for r in hooked}
    halted = bodies["rollout_halted"]
    assert halted.headers["Authorization"] == f"Bearer {BEARER}" and halted.headers["X-Token"] == HEADER_TOKEN
    assert halted.body["details"] == {"rollout": "r-7", "step": 2} and halted.body["status"] == "firing"
    assert "Authorization" not in chat.headers
    assert set(chat.body) == {"text", "blocks"} and "Model without servers: tiny-a" in chat.body["text"]
    assert value(registry, "fleetllm_notifications_sent_total", target="ops", kind="rollout_halted") == 1
    assert value(registry, "fleetllm_notifications_sent_total", target="chat", kind="model_without_servers") == 1
    assert value(registry, "fleetllm_notifications_sent_total", target="chat", kind="rollout_halted") == 0
    for secret in (BEARER, HEADER_TOKEN, SLACK_PATH, receiver.url):
        assert secret not in logs.text
    assert [e["target"] for e in logs.events("notification sent")].count("ops") == 2


def test_a_503_is_retried_a_4xx_is_not(logs: LogCapture) -> None:
    with receiving(script=[503, 200, 400]) as receiver:
        sender, registry = notifier([webhook(receiver)], attempts=3)
        sender.emit(Event(EventKind.PASS_FAILED, "failed", "pass failed"))
        receiver.wait_for(1)
        sender.emit(Event(EventKind.PASS_FAILED, "crashed", "pass crashed"))
        assert sender.close(10)
        statuses = [(r.body["subject"], r.status) for r in receiver.received]
    assert statuses == [("failed", 503), ("failed", 200), ("crashed", 400)]
    assert value(registry, "fleetllm_notifications_retries_total", target="ops") == 1
    assert value(registry, "fleetllm_notifications_sent_total", target="ops", kind="pass_failed") == 1
    assert value(registry, "fleetllm_notifications_failed_total", target="ops", kind="pass_failed") == 1
    (failure,) = logs.events("notification not delivered")
    assert failure["attempts"] == 1 and "HTTP 400" in failure["error"]
    assert BEARER not in logs.text and HEADER_TOKEN not in logs.text


def test_the_same_condition_is_sent_once_until_it_clears() -> None:
    with receiving() as receiver:
        ledger = MemoryLedger()
        first, registry_first = notifier([webhook(receiver)], ledger=ledger)
        second, registry = notifier([webhook(receiver)], ledger=ledger)  # another replica, same store
        still = [Event(EventKind.MODEL_WITHOUT_SERVERS, "tiny-a", "none serving")]
        for sender in (first, second, first):
            sender.settle(EventKind.MODEL_WITHOUT_SERVERS, still)
        assert first.drain(10) and second.drain(10)  # every snapshot decided before it clears
        receiver.wait_for(1)
        second.settle(EventKind.MODEL_WITHOUT_SERVERS, [])  # it cleared
        receiver.wait_for(2)
        assert first.close(5) and second.close(5)
        sent = [(r.body["subject"], r.body["status"]) for r in receiver.received]
    assert sent == [("tiny-a", "firing"), ("tiny-a", "resolved")]
    assert sum(value(r, "fleetllm_notifications_deduplicated_total", kind="model_without_servers")
               for r in (registry_first, registry)) == 2


def test_emit_never_waits_on_a_slow_or_unreachable_receiver() -> None:
    """The receiver holds every answer until the test lets it go: 40 events are queued (and the first
    deliveries in flight) while not one has been answered; the unreachable target is tried beside it."""
    dead = Target("dead", TargetKind.WEBHOOK, Secret(f"http://127.0.0.1:{free_port()}/x", "u"), ALL)
    gate = threading.Event()
    with receiving(gate=gate) as held:
        sender, registry = notifier([dead, webhook(held, "held")], attempts=2, timeout_s=30.0)
        for i in range(40):
            sender.emit(Event(EventKind.ROLLOUT_HALTED, f"r-{i}", "halted"))
        assert held.received == []  # every emit returned with no answer given
        wait_until(lambda: value(registry, "fleetllm_notifications_failed_total", target="dead",
                                 kind="rollout_halted") == 40)  # the dead one is not held up by the held one
        assert held.received == []
        assert sender.close(0.2) is False  # still sending at exit: given up, and said so
        gate.set()
    assert value(registry, "fleetllm_notifications_sent_total", target="held", kind="rollout_halted") < 40


def wait_until(check: Callable[[], bool], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


def test_a_full_queue_drops_its_oldest_and_counts_them() -> None:
    dead = Target("dead", TargetKind.WEBHOOK, Secret(f"http://127.0.0.1:{free_port()}/x", "u"), ALL)
    sender, registry = notifier([dead], queue_size=5, attempts=1)
    sender._thread = object()  # type: ignore[assignment]  # no sender thread: the queue only fills
    for i in range(12):
        sender.emit(Event(EventKind.ROLLOUT_HALTED, f"r-{i}", "halted"))
    assert value(registry, "fleetllm_notifications_dropped_total") == 7
    assert value(registry, "fleetllm_notifications_queued") == 5
    assert [item.event.subject for item in sender._queue] == [f"r-{i}" for i in range(7, 12)]  # type: ignore[union-attr]
    sender._thread = None
    sender._closed.set()


def test_a_held_receiver_fills_only_its_own_bounded_queue() -> None:
    """Decided notifications wait in a queue per target, bounded like the first: a receiver that answers
    nothing gets its oldest dropped (not an ever-growing backlog), and another target gets everything."""
    gate = threading.Event()
    with receiving(gate=gate) as held, receiving() as fine:
        sender, registry = notifier([webhook(held, "held"), webhook(fine, "fine")], queue_size=5, attempts=1)
        for i in range(40):
            sender.emit(Event(EventKind.ROLLOUT_HALTED, f"r-{i}", "halted"))
            if i % 4 == 3:  # a pace the first queue keeps up with: only the held target's queue overflows
                fine.wait_for(i + 1)
        fine.wait_for(40)
        wait_until(lambda: value(registry, "fleetllm_notifications_dropped_total") == 40 - 8 - 5)
        gate.set()
        held.wait_for(8 + 5)  # the 8 in flight, then the 5 newest queued
        assert sender.close(10)
    subjects = [r.body["subject"] for r in held.received]
    # the first 8 (in flight when the queue overflowed) and the 5 newest; answered in any order
    assert sorted(subjects) == sorted([f"r-{i}" for i in range(8)] + [f"r-{i}" for i in range(35, 40)])


def test_an_unreachable_receiver_is_given_up_after_its_attempts_without_its_url(logs: LogCapture) -> None:
    port = free_port()
    target = Target("chat", TargetKind.SLACK, Secret(f"http://127.0.0.1:{port}{SLACK_PATH}", "${env:S}"), ALL)
    sender, registry = notifier([target], attempts=2)
    sender.emit(Event(EventKind.PASS_FAILED, "failed", "x"))
    assert sender.close(15)
    assert value(registry, "fleetllm_notifications_failed_total", target="chat", kind="pass_failed") == 1
    (failure,) = logs.events("notification not delivered")
    assert failure["attempts"] == 2 and "cannot connect" in failure["error"]
    assert SLACK_PATH not in logs.text and "slack-secret" not in json.dumps(logs.events("notification sent"))
