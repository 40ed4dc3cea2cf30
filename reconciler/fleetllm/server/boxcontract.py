"""What the two paths of GET /vllm/config share: the Flask blueprint (box_api.py) and the event loop's
handler (boxloop.py) both run these, so the contract's host selection, served revision, answer and
fetch record are written once. Nothing here knows a web framework: a request's headers come in as
strings, an answer goes out as a `ConfigAnswer`. (The fleet key's check is auth.fleet_key_refusal.)
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from werkzeug.http import parse_etags

from fleetllm.adapters.state.records import BoxApi, FetchRecord
from fleetllm.core.hosts import ResolvedHost, resolve_host
from fleetllm.logs import get_logger, log_lines
from fleetllm.server.revisions import Rendered
from fleetllm.server.rollouts import Unservable, served_for
from fleetllm.server.runtime import Runtime

access_log = get_logger("access")
NO_REVISION = "no valid fleet revision has been loaded yet"


def error_body(message: str) -> bytes:
    """The bytes of {"error": message} exactly as the Flask app's jsonify writes them (compact, ASCII,
    a final newline): the same answer whichever path sent it."""
    return json.dumps({"error": message}, separators=(",", ":")).encode() + b"\n"


class BoxCall:
    """One box request: what it claimed, where it came from, and its record once answered."""

    def __init__(self, rt: Runtime, endpoint: BoxApi, claimed: str | None, forwarded_for: str | None,
                 peer: str) -> None:
        self.rt = rt
        self.endpoint = endpoint
        self.started = time.perf_counter()
        self.claimed = claimed
        self.forwarded_for = forwarded_for
        self.peer = peer
        self.resolved: ResolvedHost | None = None

    def resolve(self) -> str:
        self.resolved = resolve_host(self.claimed, self.forwarded_for, self.peer, self.rt.config.trusted_proxies)
        return self.resolved.name

    def answered(self, status: int, revision: str | None = None) -> Answered:
        """This request answered `status` (serving `revision`), now: what record_answers records."""
        return self, status, revision, self.rt.clock(), time.time(), time.perf_counter()

    def record(self, status: int, revision: str | None = None) -> None:
        """Record this request's answer at once (record_answers)."""
        record_answers(self.rt, (self.answered(status, revision),))


# A box request as answered: the call, its status, the revision served, and when: by the runtime's clock
# (the fetch record's time), by the wall clock (the log line's `ts`) and by time.perf_counter (the end of
# the line's duration).
Answered = tuple[BoxCall, int, str | None, float, float, float]


def record_answers(rt: Runtime, answers: Sequence[Answered]) -> None:
    """The fetch record, the counter and the `box request` log line of each answer (no secret in any), in
    order: each record and line's fields are the runtime's memo of that kind of answer (boxrecords.py).
    The store, the counter and the log each get `answers` in one hand-over (the event loop records a
    loop turn's answers together, boxloop.py): what a box request cost most of its recording on was the
    hand-over, one queue, lock or counter update for each."""
    memo = rt.box_records
    replica = rt.replica
    fetches: list[tuple[FetchRecord, float]] = []
    counts: dict[tuple[str, int], int] = {}
    runs: list[tuple[int, list[tuple[float, Mapping[str, Any]]]]] = []  # lines, a run for each level in turn
    for call, status, revision, at, wall, ended in answers:
        resolved = call.resolved
        kind = memo.get((call.endpoint, status, revision, call.claimed, call.forwarded_for, call.peer,
                         resolved.name if resolved else None, resolved.source.value if resolved else None, replica))
        fetches.append((kind.fetch, at))
        counted = (call.endpoint.value, status)
        counts[counted] = counts.get(counted, 0) + 1
        if access_log.isEnabledFor(kind.level):
            if not runs or runs[-1][0] != kind.level:
                runs.append((kind.level, []))
            runs[-1][1].append((wall, kind.fields.plus("ms", round((ended - call.started) * 1000, 2))))
    rt.store.record_fetches(fetches)
    for (endpoint, status), count in counts.items():
        rt.metrics.count_box_request(endpoint, status, count)
    for level, lines in runs:
        log_lines(access_log, "box request", level, lines)


@dataclass(frozen=True)
class ConfigAnswer:
    """How GET /vllm/config answers a known box: 200 with its JSON, 304, or an error's sentence."""

    status: int
    body: bytes | None = None  # the box JSON of a 200
    etag: str | None = None  # 200 and 304
    revision: str | None = None  # the revision served (X-Fleet-Revision, the fetch record)
    error: str | None = None  # the sentence of an error answer


def etag_matches(if_none_match: str | None, etag: str) -> bool:
    """If-None-Match names `etag` (weak comparison, `*` included), as Werkzeug reads the header."""
    return bool(if_none_match) and parse_etags(if_none_match).contains_weak(etag.strip('"'))


def config_answer(rt: Runtime, served: Rendered, name: str, if_none_match: str | None, *,
                  wait: bool = True) -> ConfigAnswer | None:
    """The answer for `name`, a box in `served`'s placement. `wait` False: None when the answer needs
    the state store or git (rollouts.served_for), so the event loop never waits on either."""
    chosen = served_for(rt, served, name, wait=wait)  # an agent box: the revision it is released
    if chosen is None:
        return None
    if isinstance(chosen, Unservable):
        return ConfigAnswer(503, error=f"box {name!r} is released revision {chosen.revision[:12]}, but {chosen.why}; "
                                       "it keeps its current config, and its operators see why in /health")
    rendered = chosen.boxes.get(name)
    if rendered is None:
        return ConfigAnswer(503, revision=chosen.revision, error=f"the control plane cannot render box {name!r}; "
                                                                 "its operators see why in its log and /health")
    if etag_matches(if_none_match, rendered.etag):
        return ConfigAnswer(304, etag=rendered.etag, revision=chosen.revision)
    return ConfigAnswer(200, rendered.body, rendered.etag, chosen.revision)
