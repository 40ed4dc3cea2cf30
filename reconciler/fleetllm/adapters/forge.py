"""The fleet repository's forge: commit statuses through GitHub's REST API ("Create a commit status",
POST {api_url}/repos/{owner}/{repo}/statuses/{sha}; GitHub Enterprise Server: api_url https://HOST/api/v3).

`CommitStatuses.post(status)` only appends to a bounded queue and returns: a reconcile pass never waits
on the forge. When the queue is full the oldest is dropped (fleetllm_commit_statuses_dropped_total).
One background thread, with an event loop of its own, sends them one at a time in the order they were
posted, so a revision's `pending` always reaches the forge before its `success`. Each attempt has
`timeout_s`; connection errors, timeouts, 429, 5xx and a 403 that is GitHub's rate limit (a Retry-After,
or a message saying so) are retried up to `attempts` times with capped exponential backoff, or after
what Retry-After asks (capped the same); any other answer is final (a 404: the repository or the token's
access is wrong; a 422: the commit is not on the forge). A redirect is never followed: the token goes
only to `api_url`. The token travels in the Authorization header only; no log line or error names it.
`close(wait_s)` waits up to `wait_s` for what is queued (the end of `reconcile --once`), then stops.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import aiohttp
from prometheus_client import CollectorRegistry, Counter, Gauge

from fleetllm.adapters.background import BackgroundSender
from fleetllm.adapters.http import HttpError, RetryPolicy, connector, request_json
from fleetllm.adapters.outgoing import scrub
from fleetllm.core.forge import CommitStatus, ForgeConfig
from fleetllm.core.secret import Secret
from fleetllm.logs import get_logger, log_event

log = get_logger("forge")
QUEUE_SIZE = 256  # statuses waiting: a few per revision; beyond it the oldest goes
BACKOFF = RetryPolicy(attempts=1, base_delay_s=1.0, factor=2.0, max_delay_s=60.0)  # as the notifier's
API_VERSION = "2022-11-28"  # GitHub's REST API version (the X-GitHub-Api-Version header)
OK = frozenset({200, 201})


class ForgeMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.sent = Counter("fleetllm_commit_statuses_sent", "Commit statuses the forge accepted, by state.",
                            ["state"], registry=r)
        self.failed = Counter("fleetllm_commit_statuses_failed", "Commit statuses given up on after their retries "
                              "(or refused: a 4xx other than a rate limit), by state.", ["state"], registry=r)
        self.retries = Counter("fleetllm_commit_statuses_retries", "Attempts to set a commit status retried (5xx, "
                               "429, a rate-limited 403, timeout, connection error).", registry=r)
        self.dropped = Counter("fleetllm_commit_statuses_dropped", "Commit statuses dropped unsent because the "
                               "queue was full (the oldest goes first).", registry=r)
        self.queued = Gauge("fleetllm_commit_statuses_queued", "Commit statuses waiting to be sent.", registry=r)


def rate_limited(exc: HttpError) -> bool:
    """GitHub's primary and secondary rate limits answer 403 (or 429) with a Retry-After, or a message
    saying so (https://docs.github.com/rest/using-the-rest-api/rate-limits-for-the-rest-api)."""
    if exc.status != 403:
        return False
    message = exc.body.get("message") if isinstance(exc.body, dict) else exc.body
    return exc.retry_after is not None or "rate limit" in str(message or "").lower()


class CommitStatuses(BackgroundSender[CommitStatus]):
    """Sets commit statuses on the forge for one process (the reconcile job), beside its passes."""

    def __init__(self, config: ForgeConfig, *, registry: CollectorRegistry | None = None,
                 clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep, backoff: RetryPolicy = BACKOFF,
                 queue_size: int = QUEUE_SIZE) -> None:
        if config.token is None:
            raise ValueError("a forge without its token cannot set statuses (forge.token was not read)")
        self.config = config
        self.token: Secret = config.token
        self.clock = clock
        self.sleep = sleep
        self.backoff = backoff
        self.queue_size = queue_size
        self.metrics = ForgeMetrics(registry or CollectorRegistry())
        super().__init__(queue_size=queue_size, queued=self.metrics.queued, dropped=self.metrics.dropped, log=log,
                         thread_name="fleetllm-forge", items="commit statuses", sender="commit status sender")

    def post(self, status: CommitStatus) -> None:
        """Set `status` on the forge, in the background (never blocks)."""
        self._put(status)

    def _dropped(self, item: CommitStatus) -> None:
        log_event(log, "commit status dropped", logging.WARNING, sha=item.sha, state=str(item.state),
                  reason="the queue is full")

    # The sender thread.

    async def _main(self) -> None:
        async with aiohttp.ClientSession(connector=connector(limit=2)) as session:
            while not self._closed.is_set():
                status = self._take()
                if status is None:  # one at a time: nothing is in flight between two takes
                    self._mark_idle()
                    await self._wait_for_work()
                    continue
                await self.send(session, status)

    async def send(self, session: aiohttp.ClientSession, status: CommitStatus) -> bool:
        """One status, with its retries; True when the forge took it. Never raises an HttpError."""
        config = self.config
        token = self.token.reveal()
        headers = {"Accept": "application/vnd.github+json", "Authorization": f"Bearer {token}",  # on the wire only
                   "X-GitHub-Api-Version": API_VERSION, "User-Agent": "fleetllm-forge"}
        for attempt in range(config.attempts):
            try:
                await request_json(session, "POST", config.statuses_url(status.sha),
                                   what=f"the commit status of {status.sha[:12]} on {config.repository}",
                                   headers=headers, body=status.body(), timeout_s=config.timeout_s, ok=OK,
                                   secrets=(token,), redirects=False)
            except HttpError as exc:
                retry = exc.retryable or rate_limited(exc)
                if not retry or attempt + 1 >= config.attempts:
                    self.metrics.failed.labels(str(status.state)).inc()
                    log_event(log, "commit status not set", logging.WARNING, sha=status.sha, state=str(status.state),
                              repository=config.repository, attempts=attempt + 1, http_status=exc.status,
                              error=scrub(str(exc), (token,)), hint=_hint(exc.status))
                    return False
                self.metrics.retries.inc()
                wait_s = self.backoff.delay(attempt, exc.retry_after, self.clock())
                log_event(log, "commit status retried", sha=status.sha, state=str(status.state),
                          attempt=attempt + 1, http_status=exc.status, wait_s=round(wait_s, 3))
                await self.sleep(wait_s)
                continue
            self.metrics.sent.labels(str(status.state)).inc()
            log_event(log, "commit status set", sha=status.sha, state=str(status.state), context=status.context,
                      repository=config.repository, attempts=attempt + 1)
            return True
        return False


def _hint(status: int | None) -> str | None:
    """What to do about a final answer (logged with it)."""
    return {
        401: "forge.token is not a valid token (expired or revoked?)",
        403: "forge.token may not write commit statuses of forge.repository (it needs Commit statuses: write, "
             "or repo:status for a classic token)",
        404: "forge.repository is not found with forge.token (a private repository the token cannot see, or a "
             "wrong OWNER/NAME or api_url)",
        422: "the forge refused the status (a commit it does not have: is forge.repository the fleet repository?)",
    }.get(status or 0, "a redirect is not followed: set forge.api_url to where it points"
          if status is not None and 300 <= status < 400 else None)


__all__ = ["CommitStatuses", "ForgeConfig", "ForgeMetrics", "rate_limited"]
