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

What reaches this handler has passed the HTTP server's limits (httpserver.py: connection caps, header
and body deadlines, body caps and budget); its answer is written like the app's, under the same send
deadline.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import Executor

import tornado
from tornado import httputil
from werkzeug.http import HTTP_STATUS_CODES

from fleetllm.adapters.state.records import BoxApi
from fleetllm.core.fleet.model import RolloutMode
from fleetllm.logs import get_logger, log_event
from fleetllm.server.auth import fleet_key_refusal
from fleetllm.server.boxcontract import NO_REVISION, Answered, BoxCall, config_answer, error_body, record_answers
from fleetllm.server.errors import NO_STORE
from fleetllm.server.rollouts import release_cache
from fleetllm.server.runtime import Runtime

log = get_logger("http")
PATH = "/vllm/config"
SERVER = "TornadoServer/%s" % tornado.version  # noqa: UP031 - what tornado.wsgi sends, byte for byte
JSON = "application/json"
MAX_TEMPLATES = 16_384  # answers' header blocks kept (by status, length, ETag and revision: never client text)


def _host_parses(host: str) -> bool:
    """Whether the WSGI bridge could build this request's environment (a `host:port` whose port is not
    a number makes it raise): a request it cannot is left to it, which answers it 400."""
    parts = host.split(":")
    if len(parts) != 2:
        return True
    try:
        int(parts[1])
    except ValueError:
        return False
    return True


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
        # Each answer's header block, built once: Tornado checks every header it is given against the
        # grammar, which cost as much as the rest of the answer. A block Tornado changes while writing
        # (Connection for a client that closes or speaks HTTP/1.0) is dropped and built again.
        self._templates: dict[tuple[int, int | None, str | None, str | None], httputil.HTTPHeaders] = {}

    def answer(self, request: httputil.HTTPServerRequest) -> bool:
        """Answer `request` and return True; or return False, having done nothing, for the app to answer."""
        if request.method != "GET" or request.path != PATH or not _host_parses(request.host):
            return False
        rt = self.rt
        headers = request.headers
        call = BoxCall(rt, BoxApi.CONFIG, headers.get("X-LLMAO-Host"), headers.get("X-Forwarded-For") or None,
                       request.remote_ip or "")
        refusal = fleet_key_refusal(rt.config, headers.get("Authorization"))
        if refusal is not None:
            self._send(request, call, refusal[0], error_body(refusal[1]))
            return True
        name = call.resolve()
        served = rt.tracker.served
        if served is None:
            self._send(request, call, 503, error_body(NO_REVISION))
            return True
        if name not in served.fleet.boxes:
            return False  # the attention list is in the state store: a thread writes it
        answer = config_answer(rt, served, name, headers.get("If-None-Match"), wait=False)
        if served.fleet.rollout_mode(name) is RolloutMode.AUTO:
            self._refresh_releases()  # for the requests after this one
        if answer is None:
            return False
        if answer.error is not None:
            self._send(request, call, answer.status, error_body(answer.error), revision=answer.revision)
        else:
            self._send(request, call, answer.status, answer.body, etag=answer.etag, revision=answer.revision)
        return True

    def record(self) -> None:
        """Record the answers written since the last turn ended (TurnJournal.record): the server calls it
        as it stops."""
        self._journal.record()

    def _refresh_releases(self) -> None:
        """Start one background read of the releases when it is due; answers go on from the last read."""
        cache = release_cache(self.rt)
        if cache.claim_refresh():
            self.executor.submit(cache.refresh)

    def _send(self, request: httputil.HTTPServerRequest, call: BoxCall, status: int, body: bytes | None, *,
              etag: str | None = None, revision: str | None = None) -> None:
        """Note the answer for `record` (box_api's `finish` records its own at once), then write it with
        the headers the Flask path sends through tornado.wsgi, in its order."""
        self._journal.note(call.answered(status, revision))
        key = (status, None if body is None else len(body), etag, revision)
        out = self._templates.get(key)
        if out is None:
            if len(self._templates) >= MAX_TEMPLATES:
                self._templates.clear()
            out = self._templates[key] = _headers(body, etag, revision)
        connection = request.connection
        assert connection is not None
        connection.write_headers(httputil.ResponseStartLine("HTTP/1.1", status, HTTP_STATUS_CODES[status].upper()),
                                 out, chunk=body or b"")
        if "Connection" in out or "Transfer-Encoding" in out:
            self._templates.pop(key, None)  # changed for this answer only: not for the next one
        connection.finish()


def _headers(body: bytes | None, etag: str | None, revision: str | None) -> httputil.HTTPHeaders:
    """The header block of an answer, in the order the Flask path sends it through tornado.wsgi."""
    out = httputil.HTTPHeaders()
    if body is not None:
        out.add("Content-Type", JSON)
        out.add("Content-Length", str(len(body)))
    if etag is not None:
        out.add("ETag", etag)
    out.add("Cache-Control", NO_STORE)
    if revision is not None:
        out.add("X-Fleet-Revision", revision)
    out.add("Server", SERVER)
    return out
