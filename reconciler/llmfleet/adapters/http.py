"""JSON over HTTP with retries: the one place that decides what is worth retrying.

Retried, with capped exponential backoff and jitter: connection errors, timeouts, 429 (honouring a
`Retry-After` of seconds, capped) and 502/503/504. Everything else is answered at once: a 4xx is the
caller's problem, and a 500 from LiteLLM's create must be re-checked by id, not blindly repeated.
Error messages name the method and URL path, never a header (the keys travel in headers).
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from llmfleet.core.fleet.jsonvalue import JSON
from llmfleet.errors import UpstreamError

RETRY_STATUSES = frozenset({429, 502, 503, 504})


class HttpError(UpstreamError):
    """A request failed for good (after retries). `status` is None for transport failures."""

    def __init__(self, message: str, status: int | None = None, body: JSON = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = body

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

    def delay(self, attempt: int, retry_after: str | None = None) -> float:
        if retry_after is not None:
            try:
                return min(max(float(retry_after), 0.0), self.max_delay_s)
            except ValueError:
                pass
        backoff = self.base_delay_s * self.factor ** attempt
        return float(min(backoff * (0.5 + random.random()), self.max_delay_s))  # noqa: S311 (jitter)


NO_RETRY = RetryPolicy(attempts=1)


def _decode(text: str) -> JSON:
    try:
        value: JSON = json.loads(text)
    except ValueError:
        return text[:300]
    return value


def scrub(text: str, secrets: tuple[str, ...]) -> str:
    """Error bodies may echo what we sent (a 422 repeats its input): never let a secret through."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "<redacted>")
    return text


async def request_json(session: aiohttp.ClientSession, method: str, url: str, *, what: str,
                       headers: Mapping[str, str] | None = None, params: Mapping[str, str] | None = None,
                       body: JSON = None, timeout_s: float = 10.0, retry: RetryPolicy = NO_RETRY,
                       ok: frozenset[int] = frozenset({200}), secrets: tuple[str, ...] = ()) -> tuple[int, JSON]:
    """(status, decoded body) for an answer whose status is in `ok`; HttpError otherwise. The error
    message has every string of `secrets` (and the Authorization header's value) scrubbed."""
    hidden = (*secrets, *(v.split(" ", 1)[-1] for k, v in (headers or {}).items() if k.lower() == "authorization"))
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    last: HttpError | None = None
    for attempt in range(retry.attempts):
        retry_after: str | None = None
        try:
            kwargs: dict[str, Any] = {"headers": dict(headers or {}), "params": dict(params or {}),
                                      "timeout": timeout}
            if body is not None:
                kwargs["json"] = body
            async with session.request(method, url, **kwargs) as response:
                text = await response.text()
                status = response.status
                if status in ok:
                    return status, _decode(text)
                decoded = _decode(scrub(text, hidden))
                last = HttpError(f"{what}: HTTP {status}: {_brief(decoded)}", status, decoded)
                if not last.retryable:
                    raise last
                retry_after = response.headers.get("Retry-After")
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
