"""Outgoing notifications: the one adapter that sends them (webhook, Slack-compatible and Apprise targets).

`Notifier.emit(event)` and `Notifier.settle(kind, firing, among)` only append to a bounded queue and
return: a reconcile pass or a box's config fetch never waits on a receiver. When the queue is full the
oldest item is dropped (fleetllm_notifications_dropped_total). One background thread, with an event
loop of its own, takes the items in order: it decides what is news against the state store's ledger
(fleetllm.core.notify.decide; a compare-and-swap there makes one replica the sender), then hands each
notification to the queue of every target that wants it: bounded too (queue_size, drop-oldest,
counted), with a few workers per target, so a slow or dead receiver holds up and drops only its own.
Each is sent through the HTTP adapter with a timeout. Connection errors, timeouts, 429 and 5xx are
retried with capped exponential backoff, or after what the answer's `Retry-After` asks (seconds or an
HTTP-date, RFC 9110 section 10.2.3), capped by the same maximum so that a receiver cannot park a target's
worker for longer (the wait holds up only that worker, never an emit); any other 4xx is final.
An Apprise target (`kind: apprise`) is sent by Apprise as a title and a text
(fleetllm.core.notify.text_message), each attempt in a daemon thread of its own (Apprise's calls block;
a receiver that never answers holds neither the sender's loop nor the process's exit), its sockets
bounded by `timeout_s` and the wait for it by twice that; Apprise says only whether it worked, so every
failure is retried the same way. Apprise's own log
records are kept out of the process's log and only a failure's, scrubbed of every part of the URL (its
host may be a token: discord://ID/TOKEN), is logged.
Each outcome is counted (sent, failed) and a failure is logged with the target's name, never its URL,
bearer or header (they are secrets, scrubbed from any error text as well). `close(wait_s)` waits up
to `wait_s` for what is queued (the end of `reconcile --once`), then stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import threading
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import aiohttp
from prometheus_client import CollectorRegistry, Counter, Gauge

from fleetllm.adapters.background import BackgroundSender
from fleetllm.adapters.http import HttpError, RetryPolicy, connector, request_json
from fleetllm.adapters.outgoing import scrub
from fleetllm.adapters.state.notifications import MemoryLedger, NotificationLedger
from fleetllm.core.notify import (
    Decision,
    Event,
    EventKind,
    Target,
    TargetKind,
    decide,
    payload,
    settle,
    slack_message,
    text_message,
)
from fleetllm.errors import UpstreamError
from fleetllm.logs import get_logger, log_event
from fleetllm_contract.addresses import is_loopback

log = get_logger("notify")
OK_STATUSES = frozenset(range(200, 300))
MAX_IN_FLIGHT = 8  # deliveries at once per target (its workers): a slow receiver holds up only its own
BACKOFF = RetryPolicy(attempts=1, base_delay_s=1.0, factor=2.0, max_delay_s=60.0)  # 1 s, 2 s, 4 s... (jitter)
CLAIM_TRIES = 3  # a lost compare-and-swap is re-read and re-decided this many times


@dataclass(frozen=True)
class Delivery:
    """How the sender behaves (notifications.* in the config)."""

    renotify_s: float
    timeout_s: float
    attempts: int
    queue_size: int
    send_resolved: bool
    backoff: RetryPolicy = BACKOFF


class NotifyMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.sent = Counter("fleetllm_notifications_sent", "Notifications delivered, by target and event kind.",
                            ["target", "kind"], registry=r)
        self.failed = Counter("fleetllm_notifications_failed", "Notifications given up on after their retries "
                              "(or refused with a 4xx), by target and event kind.", ["target", "kind"], registry=r)
        self.retries = Counter("fleetllm_notifications_retries", "Delivery attempts retried (5xx, 429, timeout, "
                               "connection error), by target.", ["target"], registry=r)
        self.dropped = Counter("fleetllm_notifications_dropped", "Events dropped unsent because the queue was "
                               "full (the oldest goes first).", registry=r)
        self.suppressed = Counter("fleetllm_notifications_deduplicated", "Events not sent: already notified and "
                                  "not due again (or claimed by another replica).", ["kind"], registry=r)
        self.queued = Gauge("fleetllm_notifications_queued", "Events waiting to be decided and sent.", registry=r)


@dataclass(frozen=True)
class _Emit:
    event: Event


@dataclass(frozen=True)
class _Settle:
    kind: EventKind
    firing: tuple[Event, ...]
    among: frozenset[str] | None
    keep: frozenset[str] = frozenset()


_Item = _Emit | _Settle


class Notifier(BackgroundSender[_Item]):
    """Sends notifications for one process (the control plane, or a reconcile job)."""

    def __init__(self, targets: Sequence[Target], delivery: Delivery, ledger: NotificationLedger, *,
                 component: str, instance: str, registry: CollectorRegistry | None = None,
                 clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self.targets = tuple(targets)
        self.sleep = sleep  # the wait between attempts (on the sender thread's loop)
        self.delivery = delivery
        self.ledger = ledger
        self.component = component
        self.instance = instance
        self.clock = clock
        self.metrics = NotifyMetrics(registry or CollectorRegistry())
        super().__init__(queue_size=delivery.queue_size, queued=self.metrics.queued, dropped=self.metrics.dropped,
                         log=log, thread_name="fleetllm-notify", items="notifications", sender="notification sender")
        self._busy = 0  # deliveries in progress (the sender thread's loop only)

    @property
    def enabled(self) -> bool:
        return bool(self.targets)

    # What callers use: never blocks.

    def emit(self, event: Event) -> None:
        """Send `event` if it is news (a firing one that is not open yet, or a resolved one that is)."""
        self._put(_Emit(event))

    def settle(self, kind: EventKind, firing: Sequence[Event], among: Collection[str] | None = None,
               keep: Collection[str] = ()) -> None:
        """Every condition of `kind` (of the subjects `among`, or all) that holds now: the new ones are
        sent, the open ones no longer listed are resolved, except those of the subjects in `keep`."""
        self._put(_Settle(kind, tuple(firing), frozenset(among) if among is not None else None, frozenset(keep)))

    def _put(self, item: _Item) -> None:
        if self.enabled:
            super()._put(item)

    # The sender thread.

    async def _main(self) -> None:
        queues: dict[str, asyncio.Queue[Decision]] = {
            target.name: asyncio.Queue(maxsize=self.delivery.queue_size) for target in self.targets}
        async with aiohttp.ClientSession(connector=connector()) as session:
            workers = [asyncio.create_task(self._worker(session, target, queues[target.name]))
                       for target in self.targets for _ in range(MAX_IN_FLIGHT)]
            try:
                await self._decide_loop(queues)
            finally:
                for worker in workers:
                    worker.cancel()
                await asyncio.gather(*workers, return_exceptions=True)

    async def _decide_loop(self, queues: dict[str, asyncio.Queue[Decision]]) -> None:
        """Take the items in order, decide them against the ledger, hand each decision to the queue of
        every target that wants it (bounded: the oldest is dropped when full)."""
        while not self._closed.is_set():
            item = self._take()
            if item is None:
                if self._busy == 0 and all(q.empty() for q in queues.values()):
                    self._mark_idle()
                await self._wait_for_work()
                continue
            try:
                decisions = await asyncio.to_thread(self._claimed, item)
            except Exception as exc:  # the store is down: this item is lost, the next may go through
                log_event(log, "notification not decided", logging.ERROR, error=f"{type(exc).__name__}: {exc}")
                continue
            for decision in decisions:
                for target in self.targets:
                    if target.wants(decision, self.delivery.send_resolved):
                        queue = queues[target.name]
                        if queue.full():
                            queue.get_nowait()
                            queue.task_done()
                            self.metrics.dropped.inc()
                        queue.put_nowait(decision)

    async def _worker(self, session: aiohttp.ClientSession, target: Target, queue: asyncio.Queue[Decision]) -> None:
        while True:
            decision = await queue.get()
            self._busy += 1  # in the same step as the get: the decide loop never sees it neither queued nor busy
            try:
                await self._deliver(session, target, decision)
            finally:
                self._busy -= 1
                queue.task_done()
                self._wake.set()

    def _claimed(self, item: _Item) -> list[Decision]:
        """The decisions of `item` this process won in the ledger (so it sends them)."""
        renotify = self.delivery.renotify_s
        won: list[Decision] = []
        if isinstance(item, _Emit):
            for _ in range(CLAIM_TRIES):
                decision = decide(self.ledger.condition(item.event.key), item.event, self.clock(), renotify)
                if decision is None:
                    break
                if self.ledger.claim(decision.previous, decision.after):
                    won.append(decision)
                    break
            if not won:
                self.metrics.suppressed.labels(str(item.event.kind)).inc()
            return won
        for decision in settle(item.kind, self.ledger.open_conditions(str(item.kind)), item.firing, self.clock(),
                               renotify, item.among, item.keep):
            if self.ledger.claim(decision.previous, decision.after):
                won.append(decision)
            else:
                self.metrics.suppressed.labels(str(item.kind)).inc()
        quiet = len(item.firing) - sum(1 for d in won if d.event.firing)
        if quiet > 0:
            self.metrics.suppressed.labels(str(item.kind)).inc(quiet)
        return won

    async def _deliver(self, session: aiohttp.ClientSession, target: Target, decision: Decision) -> None:
        document = payload(decision, now=self.clock(), component=self.component, instance=self.instance)
        url = target.url.reveal()
        send: Callable[[], Awaitable[None]]
        if target.kind is TargetKind.APPRISE:
            hidden = (*target.secrets(), *apprise_url_parts(url))
            title, text = text_message(document)
            notify_type = APPRISE_TYPES[(str(document["status"]), str(document["severity"]))]

            async def send() -> None:
                timeout_s = self.delivery.timeout_s
                try:
                    failure = await asyncio.wait_for(
                        in_daemon_thread(send_apprise, url, title, text, notify_type, timeout_s),
                        2 * timeout_s + APPRISE_GRACE_S)
                except TimeoutError:
                    failure = f"no outcome within {2 * timeout_s + APPRISE_GRACE_S:g} s"
                if failure is not None:
                    raise AppriseSendError(f"notification target {target.name}: Apprise could not send it: "
                                           f"{scrub(failure, hidden)}")
        else:
            body = slack_message(document) if target.kind is TargetKind.SLACK else document
            headers = {"User-Agent": "fleetllm-notify", "Content-Type": "application/json"}
            if target.bearer is not None:
                headers["Authorization"] = f"Bearer {target.bearer.reveal()}"  # on the wire only
            if target.header is not None:
                headers[target.header[0]] = target.header[1].reveal()
            hidden = (*target.secrets(), *_url_parts(url))

            async def send() -> None:
                await request_json(session, "POST", url, what=f"notification target {target.name}",
                                   headers=headers, body=body, timeout_s=self.delivery.timeout_s,
                                   ok=OK_STATUSES, secrets=hidden, redirects=False)
        kind = str(decision.event.kind)
        for attempt in range(self.delivery.attempts):
            try:
                await send()
            except (HttpError, AppriseSendError) as exc:
                final = exc.status is not None and 400 <= exc.status < 500 and exc.status != 429
                if final or attempt + 1 >= self.delivery.attempts:
                    self.metrics.failed.labels(target.name, kind).inc()
                    log_event(log, "notification not delivered", logging.WARNING, target=target.name,
                              kind=kind, key=decision.event.key, status=str(decision.status),
                              attempts=attempt + 1, error=scrub(str(exc), hidden))
                    return
                self.metrics.retries.labels(target.name).inc()
                wait_s = self.delivery.backoff.delay(attempt, exc.retry_after, self.clock())
                log_event(log, "notification retried", target=target.name, kind=kind, key=decision.event.key,
                          attempt=attempt + 1, http_status=exc.status, retry_after=(exc.retry_after or "")[:64] or None,
                          wait_s=round(wait_s, 3))
                await self.sleep(wait_s)
                continue
            self.metrics.sent.labels(target.name, kind).inc()
            log_event(log, "notification sent", target=target.name, kind=kind, key=decision.event.key,
                      status=str(decision.status), reason=str(decision.reason), attempts=attempt + 1)
            return


def _url_parts(url: str) -> tuple[str, ...]:
    """The path and query of a URL, as aiohttp may re-encode the whole: scrubbed from errors too."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return ()
    return tuple(p for p in (parts.path, parts.query) if len(p) > 1)


class AppriseSendError(UpstreamError):
    """Apprise could not send a notification (it does not say why in a way to tell 4xx from 5xx: retried).
    The message is scrubbed of the target's URL and of every part of it."""

    status: int | None = None
    retry_after: str | None = None


APPRISE_GRACE_S = 5.0  # beyond 2 x timeout_s (connect, then read) before an Apprise attempt counts as failed


async def in_daemon_thread(function: Callable[..., str | None], *args: Any) -> str | None:
    """`function(*args)` in a daemon thread of its own: unlike asyncio.to_thread's pool, a call that never
    returns is left behind when the awaiting task gives up, and never holds up the interpreter's exit."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[str | None] = loop.create_future()

    def deliver(result: str | None, error: BaseException | None) -> None:  # on the loop
        if done.done():  # the awaiting task gave up
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(result)

    def work() -> None:
        result, error = None, None
        try:
            result = function(*args)
        except Exception as exc:  # handed to the awaiting task
            error = exc
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            loop.call_soon_threadsafe(deliver, result, error)

    threading.Thread(target=work, name="fleetllm-apprise", daemon=True).start()
    return await done


# Apprise's notification types, by the payload's status and severity (its services' colours and icons).
APPRISE_TYPES = {("firing", "critical"): "failure", ("firing", "warning"): "warning", ("firing", "info"): "info",
                 ("resolved", "critical"): "success", ("resolved", "warning"): "success"}
_APPRISE_LOG = threading.Lock()
_apprise_quiet = False


def _quiet_apprise() -> None:
    """Apprise logs through the `apprise` logger; nothing of it reaches the process's log or stderr (a
    record may quote a URL): each call's records come back with its result instead (send_apprise)."""
    global _apprise_quiet
    with _APPRISE_LOG:
        if not _apprise_quiet:
            apprise_log = logging.getLogger("apprise")
            apprise_log.propagate = False
            apprise_log.addHandler(logging.NullHandler())
            _apprise_quiet = True


def send_apprise(url: str, title: str, body: str, notify_type: str, timeout_s: float) -> str | None:
    """Send one notification with Apprise (blocking: run it in a thread). None when it was delivered, else
    what Apprise said went wrong (unscrubbed: the caller scrubs it)."""
    import apprise

    _quiet_apprise()
    # No deadline and no async mode: Apprise then sends in this thread rather than in its own pools (whose
    # threads would outlive a give-up and hold up the exit); the sockets' timeouts bound the attempt.
    asset = apprise.AppriseAsset(app_id="fleetllm", app_desc="fleetllm notifications", app_url="",
                                 secure_logging=True, async_mode=False, service_timeout=0)
    sender = apprise.Apprise(asset=asset)
    if not sender.add(url):
        return "the url is not one Apprise can send to"
    for service in sender:
        service.socket_connect_timeout = service.socket_read_timeout = timeout_s
    result: Any = sender.notify(body=body, title=title, notify_type=apprise.NotifyType(notify_type),
                                body_format=apprise.NotifyFormat.TEXT)
    if result:
        return None
    said = [entry.message for entry in result.logs() if entry.level in ("WARNING", "ERROR", "CRITICAL")]
    return "; ".join(said)[:1000] or result.status.name.lower()


def apprise_problem(url: str) -> str | None:
    """Why `url` is not an Apprise URL a target can use, without quoting it; None when it is. A URL that
    sends in clear (json://, mmost://, ...: the plain form of a scheme that has a secure one) is refused
    unless to a loopback host: an Apprise URL always carries its credential."""
    import apprise

    _quiet_apprise()
    service = apprise.Apprise.instantiate(url)
    scheme = url.partition("://")[0].lower() if "://" in url else ""
    if service is None:
        named = f"scheme {scheme!r}" if re.fullmatch(r"[a-z][a-z0-9+.-]{0,15}", scheme) else "no scheme://"
        return (f"not a URL Apprise can send to ({named}): see Apprise's list of services and the URL each "
                "takes")
    plain = {p.lower() for p in _names(getattr(type(service), "protocol", None))}
    if scheme in plain and not getattr(service, "secure", True):
        try:
            host = urlsplit(url).hostname or ""
        except ValueError:
            host = ""
        if not is_loopback(host):
            secure = sorted(_names(getattr(type(service), "secure_protocol", None)))
            return (f"{scheme}:// sends in clear text, and an Apprise URL carries its credential: use "
                    f"{' or '.join(s + '://' for s in secure) or 'a secure scheme'} (plain ones are for loopback "
                    "receivers only)")
    return None


def _names(value: object) -> set[str]:
    if isinstance(value, str):
        return {value}
    if isinstance(value, (list, tuple, set, frozenset)):
        return {str(v) for v in value}
    return set()


def apprise_url_parts(url: str) -> tuple[str, ...]:
    """Every part of an Apprise URL but its scheme, as written and decoded: its host, user, password, path
    segments and query values may each be a token (discord://ID/TOKEN, tgram://BOTTOKEN/CHAT)."""
    rest = url.partition("://")[2] if "://" in url else url
    parts = {p for p in re.split(r"[/:@?&=#,+]+", rest) if len(p) >= 3}
    return tuple(sorted({p for p in (*parts, *(unquote(p) for p in parts), rest) if p}, key=len, reverse=True))


def disabled() -> Notifier:
    """A notifier with no target: emit and settle do nothing."""
    return Notifier((), Delivery(3600.0, 10.0, 1, 1, True), MemoryLedger(), component="none", instance="none")


__all__ = ["Delivery", "Notifier", "NotifyMetrics", "disabled"]
