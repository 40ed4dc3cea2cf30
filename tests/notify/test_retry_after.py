"""The sender honours a receiver's Retry-After (RFC 9110 section 10.2.3: delta-seconds or an HTTP-date),
capped by the backoff's maximum, against a real receiver on loopback that answers 429/503 with it and then
200. The waits asked for are read from the sender's sleep (no duration is measured); a receiver asking for
an hour holds up only its own target, never an emit or another target."""

from __future__ import annotations

import asyncio
import math
from email.utils import formatdate

import pytest
from prometheus_client import CollectorRegistry

from fleetllm.adapters.http import RetryPolicy, retry_after_s
from fleetllm.adapters.notify import BACKOFF, Delivery, Notifier
from fleetllm.adapters.state.notifications import MemoryLedger
from fleetllm.core.notify import Event, EventKind
from tests.notify.receiver import receiving
from tests.notify.test_delivery import notifier, value, wait_until, webhook

NOW = 1_764_000_000.0  # the sender's clock in these tests (Unix time)


@pytest.mark.parametrize(("header", "seconds"), [
    ("7", 7.0),
    (" 120 ", 120.0),
    ("0", 0.0),
    (formatdate(NOW + 30, usegmt=True), 30.0),  # IMF-fixdate: Sun, 06 Nov 1994 08:49:37 GMT
    ("Monday, 24-Nov-25 16:00:45 GMT", 45.0),  # the obsolete RFC 850 form (NOW is 2025-11-24 16:00:00 UTC)
    ("Mon Nov 24 16:01:00 2025", 60.0),  # the obsolete asctime form, no zone: GMT
    (formatdate(NOW - 3600, usegmt=True), 0.0),  # a date gone by: at once
    ("9" * 40, math.inf),  # more than any cap, never converted digit by digit
])
def test_both_forms_are_read(header: str, seconds: float) -> None:
    assert retry_after_s(header, NOW) == seconds


@pytest.mark.parametrize("header", [None, "", "1.5", "-3", "+3", "soon", "\u00b2", "Mon, 31 Nov 2025 16:00:00 GMT"])
def test_anything_else_is_ignored(header: str | None) -> None:
    assert retry_after_s(header, NOW) is None


def test_the_backoff_caps_what_a_receiver_asks() -> None:
    policy = RetryPolicy(attempts=3, base_delay_s=1.0, factor=2.0, max_delay_s=60.0)
    assert policy.delay(0, "86400", NOW) == 60.0
    assert policy.delay(0, formatdate(NOW + 86400, usegmt=True), NOW) == 60.0
    assert policy.delay(0, "9" * 40, NOW) == 60.0
    assert policy.delay(2, "3", NOW) == 3.0  # a shorter wait than the backoff's is honoured too
    assert 0.5 <= policy.delay(0, "soon", NOW) <= 1.5  # not understood: the backoff with its jitter


def test_a_429_and_a_503_with_retry_after_are_retried_after_what_they_ask() -> None:
    script = [(429, {"Retry-After": "7"}),
              (503, {"Retry-After": formatdate(NOW + 30, usegmt=True)}),
              (429, {"Retry-After": "86400"}),  # a day: capped
              200]
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)
        await asyncio.sleep(0)

    with receiving(script=script) as receiver:
        registry = CollectorRegistry()
        delivery = Delivery(renotify_s=3600.0, timeout_s=5.0, attempts=4, queue_size=10, send_resolved=True)
        sender = Notifier([webhook(receiver)], delivery, MemoryLedger(), component="control-plane", instance="test",
                          registry=registry, clock=lambda: NOW, sleep=sleep)
        sender.emit(Event(EventKind.PASS_FAILED, "failed", "pass failed"))
        receiver.wait_for(1)
        assert sender.close(10)
        statuses = [r.status for r in receiver.received]
    assert statuses == [429, 503, 429, 200]
    assert waits == [7.0, 30.0, BACKOFF.max_delay_s]
    assert value(registry, "fleetllm_notifications_retries_total", target="ops") == 3
    assert value(registry, "fleetllm_notifications_sent_total", target="ops", kind="pass_failed") == 1


def test_a_receiver_asking_for_an_hour_holds_up_only_its_own_target() -> None:
    """The real sleep: the parked target waits (capped), emit returned at once and the other target got its
    notification meanwhile; at exit the parked one is given up within the drain time, and said so."""
    with receiving(script=[(429, {"Retry-After": "3600"})] * 2) as parked, receiving() as fine:
        sender, registry = notifier([webhook(parked, "parked"), webhook(fine, "fine")], attempts=3)
        sender.emit(Event(EventKind.ROLLOUT_HALTED, "r-1", "halted"))
        fine.wait_for(1)
        wait_until(lambda: bool(parked.received))
        assert [r.status for r in parked.received] == [429]
        assert value(registry, "fleetllm_notifications_sent_total", target="fine", kind="rollout_halted") == 1
        assert sender.close(0.2) is False
    assert value(registry, "fleetllm_notifications_sent_total", target="parked", kind="rollout_halted") == 0


def test_the_delivery_default_backoff_is_the_cap() -> None:
    assert Delivery(3600.0, 5.0, 3, 10, True).backoff.max_delay_s == BACKOFF.max_delay_s == 60.0
