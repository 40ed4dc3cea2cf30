"""GET /vllm/config on the event loop: the pre-rendered box JSON, answered in the loop turn that read
the request, with no hop to a request thread and no WSGI environment, Flask request or response built.

The contract is the Flask view's (box_api.vllm_config), through the same functions (boxcontract.py;
the fleet key's check is auth.fleet_key_refusal): the same status, body and headers, the same fetch
record, counter and `box request` log line. Those are recorded once per loop turn, after its answers
are written: the store, the counter and the log each take a turn's answers in one
hand-over (TurnJournal). Only what is in memory is answered here; a request that
needs the state store or git (a box not in the placement goes on the attention list, an agent box's
releases are older than rollouts.CACHE_TTL_S, a released revision not rendered yet) is handed to the
Flask app on a thread, untouched, and answered there. So are every other method and path, POST
/vllm/report included: a report is written to the state store as it is answered.

What reaches this handler has passed the HTTP server's connection caps, header deadline and Host rule
(httpserver.py); it reads no body (the server drops one after the answer), and its answer is written
like the app's, under the same send deadline.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import Executor

from fleetllm.adapters.state.records import BoxApi
from fleetllm.core.fleet.model import RolloutMode
from fleetllm.logs import get_logger, log_event
from fleetllm.server.auth import fleet_key_refusal
from fleetllm.server.boxcontract import NO_REVISION, Answered, BoxCall, config_answer, error_body, record_answers
from fleetllm.server.errors import NO_STORE
from fleetllm.server.rollouts import release_cache
from fleetllm.server.runtime import Runtime
from fleetllm_gateway.httpserver import Request, Response

log = get_logger("http")
PATH = "/vllm/config"
JSON = "application/json"


class TurnJournal:
    """The answers of the event loop's current turn, recorded together when it ends
    (boxcontract.record_answers). `note` only on the loop's thread."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self._answers: list[Answered] = []

    def note(self, answered: Answered) -> None:
        self._answers.append(answered)
        if len(self._answers) == 1:
            asyncio.get_running_loop().call_soon(self.record)

    def record(self) -> None:
        """Record the answers noted since the last call: at the end of each turn that noted one, and by
        the server as it stops."""
        answers, self._answers = self._answers, []
        if answers:
            try:
                record_answers(self.rt, answers)
            except Exception as exc:  # a bug: said in the log, never an exception in the event loop's callback
                log_event(log, "box requests not recorded", logging.ERROR, error=type(exc).__name__,
                          answers=len(answers))


class BoxLoop:
    """Answers GET /vllm/config for the runtime `rt` on the event loop (`answer`); `executor` reads the
    releases of agent boxes from the state store in the background (rollouts.ReleaseCache)."""

    def __init__(self, rt: Runtime, executor: Executor) -> None:
        self.rt = rt
        self.executor = executor
        self._journal = TurnJournal(rt)

    def answer(self, request: Request) -> Response | None:
        """The answer to `request`; or None, having done nothing, for the app to answer."""
        if request.method != "GET" or request.target.partition("?")[0] != PATH:
            return None
        rt = self.rt
        header = request.joined  # as the Flask view reads them: a field sent twice is one, joined by ","
        call = BoxCall(rt, BoxApi.CONFIG, header("x-llmao-host"), header("x-forwarded-for") or None, request.remote)
        refusal = fleet_key_refusal(rt.config, header("authorization"))
        if refusal is not None:
            return self._answer(call, refusal[0], error_body(refusal[1]))
        name = call.resolve()
        served = rt.tracker.served
        if served is None:
            return self._answer(call, 503, error_body(NO_REVISION))
        if name not in served.fleet.boxes:
            return None  # the attention list is in the state store: a thread writes it
        answer = config_answer(rt, served, name, header("if-none-match"), wait=False)
        if served.fleet.rollout_mode(name) is RolloutMode.AUTO:
            self._refresh_releases()  # for the requests after this one
        if answer is None:
            return None
        if answer.error is not None:
            return self._answer(call, answer.status, error_body(answer.error), revision=answer.revision)
        return self._answer(call, answer.status, answer.body, etag=answer.etag, revision=answer.revision)

    def record(self) -> None:
        """Record the answers written since the last turn ended (TurnJournal.record): the server calls it
        as it stops."""
        self._journal.record()

    def _refresh_releases(self) -> None:
        """Start one background read of the releases when it is due; answers go on from the last read."""
        cache = release_cache(self.rt)
        if cache.claim_refresh():
            self.executor.submit(cache.refresh)

    def _answer(self, call: BoxCall, status: int, body: bytes | None, *, etag: str | None = None,
                revision: str | None = None) -> Response:
        """Note the answer for `record` (box_api's `finish` records its own at once); the response, with
        the headers the Flask view sends, in its order."""
        self._journal.note(call.answered(status, revision))
        headers = [("Content-Type", JSON)] if body is not None else []
        if etag is not None:
            headers.append(("ETag", etag))
        headers.append(("Cache-Control", NO_STORE))
        if revision is not None:
            headers.append(("X-Fleet-Revision", revision))
        return Response(status, body or b"", headers)
