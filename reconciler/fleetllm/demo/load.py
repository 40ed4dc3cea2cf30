"""Callers' traffic for the rollout scenarios: chat completions through LiteLLM to every model at a
steady rate, counted per model, so a scenario can say (and a test assert) how many requests a change
cost its callers.

Open loop: each model gets a request every 1/rate seconds whether or not the last one has answered, as
independent callers would send them, so a slow or stopped server cannot lower the rate it is measured
at. A request fails when the proxy answers anything but a 200 with a completion, or does not answer
within `timeout_s`. The generator runs on its own thread and event loop beside the demo's passes.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import aiohttp

from fleetllm.core.secret import Secret

MAX_IN_FLIGHT = 32  # per model: beyond it a tick is counted as failed (the proxy is not keeping up)
# A pooled connection idle for longer is closed, not sent on: uvicorn (LiteLLM's server) closes one idle
# for 5 s, and a request sent on it as it closes fails with "Connection reset by peer" (aiohttp's
# default keeps one 15 s). After a slow spell of the proxy, the many connections it left idle met that.
KEEPALIVE_S = 2.0
REASON_CHARS = 160


@dataclass(frozen=True)
class Failure:
    at_s: float  # seconds since the generator started
    model: str
    reason: str


@dataclass
class ModelTally:
    sent: int = 0
    ok: int = 0
    failures: list[Failure] = field(default_factory=list)

    @property
    def failed(self) -> int:
        return len(self.failures)


@dataclass(frozen=True)
class LoadReport:
    duration_s: float
    rate_per_model: float
    tallies: dict[str, ModelTally]

    @property
    def failed(self) -> int:
        return sum(t.failed for t in self.tallies.values())

    def lines(self) -> list[str]:
        out = []
        for model, tally in sorted(self.tallies.items()):
            out.append(f"{model}: {tally.sent} requests, {tally.ok} answered, {tally.failed} failed")
            out.extend(f"    at {f.at_s:.1f} s: {f.reason}" for f in tally.failures[:5])
        return out


def _completed(status: int, body: bytes) -> str | None:
    """None when the answer is a completion, else why not."""
    if status != 200:
        return f"HTTP {status}: {body[:REASON_CHARS].decode(errors='replace')}"
    try:
        answer = json.loads(body)
        str(answer["choices"][0]["message"]["content"])  # only its presence is checked
    except (ValueError, KeyError, IndexError, TypeError):
        return f"HTTP 200 without a completion: {body[:REASON_CHARS].decode(errors='replace')}"
    return None


class LoadGenerator:
    """`start()`, then `stop()` for the report. Thread-safe reads of the running tallies with `snapshot()`."""

    def __init__(self, url: str, key: Secret, models: Iterable[str], *, rate_per_model: float = 2.0,
                 timeout_s: float = 30.0) -> None:
        if rate_per_model <= 0:
            raise ValueError("rate_per_model must be positive")
        self.url = url.rstrip("/") + "/v1/chat/completions"
        self.key = key
        self.models = sorted(set(models))
        self.rate = rate_per_model
        self.timeout_s = timeout_s
        self.tallies = {m: ModelTally() for m in self.models}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = 0.0
        self._stopped = 0.0

    # -- control -----------------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("the load generator runs already")
        self._started = time.monotonic()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), name="fleetllm-load", daemon=True)
        self._thread.start()

    def stop(self) -> LoadReport:
        """Stop sending, wait for the requests in flight (at most timeout_s), and report."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.timeout_s + 5)
        self._stopped = time.monotonic()
        return self.snapshot()

    def snapshot(self) -> LoadReport:
        end = self._stopped or time.monotonic()
        with self._lock:
            copied = {m: ModelTally(t.sent, t.ok, list(t.failures)) for m, t in self.tallies.items()}
        return LoadReport(round(end - self._started, 3), self.rate, copied)

    # -- the loop ----------------------------------------------------------------------------------
    async def _run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        connector = aiohttp.TCPConnector(limit=MAX_IN_FLIGHT * max(1, len(self.models)), keepalive_timeout=KEEPALIVE_S)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            await asyncio.gather(*(self._model(session, m) for m in self.models))

    async def _model(self, session: aiohttp.ClientSession, model: str) -> None:
        in_flight: set[asyncio.Task[None]] = set()
        period = 1.0 / self.rate
        next_at = time.monotonic()
        while not self._stop.is_set():
            if len(in_flight) >= MAX_IN_FLIGHT:
                self._count(model, f"more than {MAX_IN_FLIGHT} requests in flight: the proxy does not answer")
            else:
                task = asyncio.create_task(self._one(session, model))
                in_flight.add(task)
                task.add_done_callback(in_flight.discard)
            next_at += period
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
        if in_flight:
            await asyncio.gather(*in_flight, return_exceptions=True)

    async def _one(self, session: aiohttp.ClientSession, model: str) -> None:
        body = {"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}
        headers = {"Authorization": f"Bearer {self.key.reveal()}"}
        try:
            async with session.post(self.url, json=body, headers=headers) as response:
                why = _completed(response.status, await response.read())
        except TimeoutError:
            why = f"no answer within {self.timeout_s:g} s"
        except aiohttp.ClientError as exc:
            why = f"{type(exc).__name__}: {exc}"[:REASON_CHARS]
        self._count(model, why)

    def _count(self, model: str, why: str | None) -> None:
        with self._lock:
            tally = self.tallies[model]
            tally.sent += 1
            if why is None:
                tally.ok += 1
            else:
                tally.failures.append(Failure(round(time.monotonic() - self._started, 2), model, why))
