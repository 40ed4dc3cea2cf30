"""JSON over HTTP with retries: the one place that decides what is worth retrying.

Retried, with capped exponential backoff and jitter: connection errors, timeouts, 429 (honouring a
`Retry-After`, seconds or an HTTP-date, capped: `retry_after_s`) and 502/503/504. Everything else is
answered at once: a 4xx is the caller's problem, and a 500 from LiteLLM's create must be re-checked by
id, not blindly repeated.
Error messages name the method and URL path, never a header (the keys travel in headers).
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import math
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC
from typing import Any

import aiohttp

from fleetllm.adapters.outgoing import scrub
from fleetllm.core.fleet.jsonvalue import JSON
from fleetllm.errors import UpstreamError

RETRY_STATUSES = frozenset({429, 502, 503, 504})
# A pooled connection idle for longer is closed, not sent on. uvicorn (LiteLLM's and vLLM's server) closes
# one idle for 5 s; a request sent on it as it closes is reset ("Connection reset by peer") before any
# answer, and a write that meets that fails its pass. aiohttp's default keeps one 15 s. The box gateway's
# own upstream client keeps 4 s for the same reason.
KEEPALIVE_S = 4.0


def connector(limit: int = 100) -> aiohttp.TCPConnector:
    """The TCP connector of every session that talks to LiteLLM, vLLM, a provider or a receiver."""
    return aiohttp.TCPConnector(limit=limit, ttl_dns_cache=300, keepalive_timeout=KEEPALIVE_S)


class HttpError(UpstreamError):
    """A request failed for good (after retries). `status` is None for transport failures."""

    def __init__(self, message: str, status: int | None = None, body: JSON = None,
                 retry_after: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = body
        self.retry_after = retry_after  # the answer's Retry-After header as sent (retry_after_s reads it)

    @property
    def retryable(self) -> bool:
        """A transport failure or a status that says "later" (429, 502-504); any other answer stands."""
        return self.status is None or self.status in RETRY_STATUSES


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 3
    base_delay_s: float = 0.15
    factor: float = 1.5
    max_delay_s: float = 10.0

    def delay(self, attempt: int, retry_after: str | None = None, now: float | None = None) -> float:
        """Seconds before retry `attempt + 1`: what a Retry-After header asks for (at `now`, Unix time;
        default: the clock), else the exponential backoff with jitter; never more than max_delay_s, so a
        receiver cannot park a retry for longer."""
        asked = retry_after_s(retry_after, time.time() if now is None else now)
        if asked is not None:
            return min(asked, self.max_delay_s)
        backoff = self.base_delay_s * self.factor ** attempt
        return float(min(backoff * (0.5 + random.random()), self.max_delay_s))  # noqa: S311 (jitter)


NO_RETRY = RetryPolicy(attempts=1)
MAX_DELTA_DIGITS = 12  # a longer delta-seconds is more than any cap: read as "very long", not converted


def retry_after_s(value: str | None, now: float) -> float | None:
    """The seconds to wait that a Retry-After header value asks for (RFC 9110 section 10.2.3): delta-seconds
    (1*DIGIT), or an HTTP-date (IMF-fixdate, or the obsolete RFC 850 and asctime forms that section 5.6.7
    says a recipient must accept; parsed by the standard library's email.utils), a date in the past being 0.
    None when absent or neither form (the caller then backs off as it would without it). Uncapped: the
    caller caps it."""
    if value is None:
        return None
    text = value.strip()
    if text.isascii() and text.isdigit():
        return float(text) if len(text) <= MAX_DELTA_DIGITS else math.inf
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:  # asctime carries no zone: HTTP dates are in GMT
        when = when.replace(tzinfo=UTC)
    return max(0.0, when.timestamp() - now)


def _decode(text: str) -> JSON:
    try:
        value: JSON = json.loads(text)
    except ValueError:
        return text[:300]
    return value


async def request_json(session: aiohttp.ClientSession, method: str, url: str, *, what: str,
                       headers: Mapping[str, str] | None = None, params: Mapping[str, str] | None = None,
                       body: JSON = None, timeout_s: float = 10.0, retry: RetryPolicy = NO_RETRY,
                       ok: frozenset[int] = frozenset({200}), secrets: tuple[str, ...] = (),
                       redirects: bool = True) -> tuple[int, JSON]:
    """(status, decoded body) for an answer whose status is in `ok`; HttpError otherwise. The error
    message has every string of `secrets` (and the Authorization header's value) scrubbed. Without
    `redirects` a 3xx is an answer (an HttpError unless in `ok`), never followed: a credential in the
    headers goes only where the caller sent it."""
    hidden = (*secrets, *(v.split(" ", 1)[-1] for k, v in (headers or {}).items() if k.lower() == "authorization"))
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    last: HttpError | None = None
    for attempt in range(retry.attempts):
        retry_after: str | None = None
        try:
            kwargs: dict[str, Any] = {"headers": dict(headers or {}), "params": dict(params or {}),
                                      "timeout": timeout, "allow_redirects": redirects}
            if body is not None:
                kwargs["json"] = body
            async with session.request(method, url, **kwargs) as response:
                text = await response.text()
                status = response.status
                if status in ok:
                    return status, _decode(text)
                decoded = _decode(scrub(text, hidden))
                retry_after = response.headers.get("Retry-After")
                last = HttpError(f"{what}: HTTP {status}: {_brief(decoded)}", status, decoded, retry_after)
                if not last.retryable:
                    raise last
        except TimeoutError:
            last = HttpError(f"{what}: no answer within {timeout_s:g}s")
        except aiohttp.ClientError as exc:
            last = HttpError(scrub(f"{what}: {type(exc).__name__}: {_client_error_text(exc)}", hidden))
        if attempt + 1 < retry.attempts:
            await asyncio.sleep(retry.delay(attempt, retry_after))
    assert last is not None
    raise last


def _client_error_text(exc: aiohttp.ClientError) -> str:
    if isinstance(exc, aiohttp.ClientConnectorError):
        return f"cannot connect to {exc.host}:{exc.port} ({exc.os_error.strerror or exc.os_error})"
    return str(exc)[:200]


def _brief(body: JSON) -> str:
    """The error message of a JSON error body (LiteLLM's, Vast's, RunPod's), else a short excerpt."""
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])[:300]
        for key in ("detail", "msg", "message", "title", "error"):
            if isinstance(body.get(key), str):
                return str(body[key])[:300]
    return json.dumps(body)[:300] if not isinstance(body, str) else body[:300]
