"""GET /vllm/config on the event loop (server/boxloop.py) answers exactly as the Flask view does: the same
status, headers and body, the same fetch record and `box request` log line; and what it cannot answer
from memory (an unknown box, a report, another method) reaches the Flask app untouched.

Both paths run behind the real HTTP server (httpserver.PlaneServer and its handler) on a loopback
port, on an event loop in a thread of the test."""

from __future__ import annotations

import asyncio
import http.client
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import pytest
from flask import Flask

from fleetllm.adapters.state.records import FetchRecord
from fleetllm.core.boxreport import BoxReport
from fleetllm.core.fleet.jsonvalue import freeze_mapping
from fleetllm.core.rollout.model import BoxRelease, BoxState, Rollout, RolloutState
from fleetllm.server import rollouts
from fleetllm.server.accesslog import access_logged
from fleetllm.server.app import create_app
from fleetllm.server.boxloop import BoxLoop
from fleetllm.server.rollouts import release_cache
from fleetllm.server.runtime import Runtime
from fleetllm_contract.report import ReportOutcome
from fleetllm_gateway.httpserver import Request
from tests.server.conftest import FLEET_KEY, KNOWN_BOX, LogCapture, box_headers
from tests.support.plane_thread import detached_request, plane_serving

Answer = tuple[int, list[tuple[str, str]], bytes]


@pytest.fixture(autouse=True)
def releases_in_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """The example fleet rolls out automatically, so a config request needs the boxes' releases: the
    first request reads them (on a thread), the next CACHE_TTL_S use them. Here they stay read."""
    import fleetllm.server.rollouts as rollouts

    monkeypatch.setattr(rollouts, "CACHE_TTL_S", 600.0)


class Served:
    """The control plane's HTTP server on a loopback port; `app_calls` counts the requests the Flask app saw."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.app_calls = 0

    def request(self, method: str, path: str, headers: dict[str, str], body: bytes | None = None) -> Answer:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            connection.request(method, path, body=body, headers=headers)
            response = connection.getresponse()
            return response.status, [(k, v) for k, v in response.getheaders() if k != "Date"], response.read()
        finally:
            connection.close()


@contextmanager
def serving(runtime: Runtime, *, on_loop: bool) -> Iterator[Served]:
    app: Flask = create_app(runtime)
    wsgi = access_logged(app)
    box: list[Served] = []

    def counted(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        box[0].app_calls += 1
        return wsgi(environ, start_response)

    with plane_serving(counted, lambda executor: BoxLoop(runtime, executor) if on_loop else None) as server:
        box.append(Served(server.local[1]))
        yield box[0]


def last_fetch(runtime: Runtime) -> FetchRecord:
    return runtime.store.recent_fetches(limit=1)[0]


def without_times(event: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in event.items() if k not in ("ts", "ms")}


CASES: dict[str, tuple[dict[str, str], bool]] = {  # headers, answered on the loop
    "known box": (box_headers(), True),
    "its config unchanged": (box_headers(**{"If-None-Match": "*"}), True),
    "the peer's box by X-Forwarded-For": (box_headers(None, **{"X-Forwarded-For": f"{KNOWN_BOX}, 10.0.0.1"}), True),
    "missing key": (box_headers(key=None), True),
    "wrong key": (box_headers(key=FLEET_KEY + "x"), True),
    "bearer scheme in capitals, claim empty": ({"Authorization": f"BEARER {FLEET_KEY}", "X-LLMAO-Host": ""}, False),
    "a box not in the placement": (box_headers("198.51.100.99"), False),
    "a legacy pair": (box_headers("198.51.100.23"), True),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_loop_answers_as_the_flask_view_does(runtime: Runtime, logs: LogCapture, case: str) -> None:
    headers, loop_answers = CASES[case]
    release_cache(runtime).get()
    answers: list[Answer] = []
    records: list[FetchRecord] = []
    lines: list[dict[str, Any]] = []
    for on_loop in (True, False):
        with serving(runtime, on_loop=on_loop) as served:
            answers.append(served.request("GET", "/vllm/config", headers))
            assert served.app_calls == (0 if on_loop and loop_answers else 1)
        records.append(last_fetch(runtime))
        lines.append(without_times(logs.events("box request")[-1]))
    assert answers[0] == answers[1]
    assert records[0].endpoint == records[1].endpoint
    assert {**records[0].__dict__, "id": None} == {**records[1].__dict__, "id": None}
    assert lines[0] == lines[1]
    if case == "its config unchanged":
        assert answers[0][0] == 304
    if case == "known box":
        assert answers[0][0] == 200 and b'"servers"' in answers[0][2]


def test_the_loop_answers_a_known_etag_with_304_and_refusals_as_the_contract_says(runtime: Runtime) -> None:
    release_cache(runtime).get()
    with serving(runtime, on_loop=True) as served:
        status, headers, body = served.request("GET", "/vllm/config", box_headers())
        named = {k.lower(): v for k, v in headers}
        etag = named["etag"]
        assert (status, named["cache-control"], named["content-type"]) == (200, "no-store", "application/json")
        assert served.request("GET", "/vllm/config", box_headers(**{"If-None-Match": etag}))[0] == 304
        assert served.request("GET", "/vllm/config", box_headers(**{"If-None-Match": '"other"'}))[2] == body
        assert served.request("GET", "/vllm/config", box_headers(key=None))[2] == \
            b'{"error":"missing fleet key: send Authorization: Bearer <fleet key>"}\n'
        assert served.request("GET", "/vllm/config", box_headers(key="nope"))[:1] == (403,)
        assert served.app_calls == 0
        assert FLEET_KEY.encode() not in body


def test_no_fleet_key_configured_is_503_on_the_loop(make_runtime: Callable[..., Runtime]) -> None:
    runtime = make_runtime(secrets={"fleet_key": None, "vllm_api_salt": "${env:SALT}"})
    with serving(runtime, on_loop=True) as served:
        assert served.request("GET", "/vllm/config", box_headers())[0] == 503
        assert served.app_calls == 0


def test_what_the_loop_does_not_answer_reaches_the_app(runtime: Runtime) -> None:
    with serving(runtime, on_loop=True) as served:
        assert served.request("HEAD", "/vllm/config", box_headers())[0] == 200
        assert served.request("GET", "/vllm/config?x=1", box_headers())[0] == 200  # the query is ignored on both
        calls = served.app_calls
        assert served.request("POST", "/vllm/report", box_headers(**{"Content-Type": "application/json"}),
                              b"{}")[0] == 400
        assert served.request("GET", "/vllm/installer", box_headers())[0] == 200
        assert served.request("GET", "/vllm/%63onfig", box_headers())[0] == 200
        assert served.app_calls == calls + 3
        assert served.request("GET", "/health", {})[0] == 200


def test_a_box_whose_releases_are_not_in_memory_is_answered_by_the_app(runtime: Runtime) -> None:
    """Its releases are read from the state store, which the loop never waits on: a thread reads them;
    within rollouts.CACHE_TTL_S the next request is answered on the loop from what was read."""
    served_revision = runtime.tracker.served.revision if runtime.tracker.served else ""
    runtime.store.record_report(BoxReport(KNOWN_BOX, runtime.clock(), "192.0.2.50", served_revision, "test",
                                          ReportOutcome.INSTALLED, freeze_mapping({"agent": True})), keep=5)
    runtime.store.save_rollout(Rollout(served_revision, RolloutState.RUNNING, 1.0, 2.0, waves=1),
                               {KNOWN_BOX: BoxRelease(KNOWN_BOX, served_revision, served_revision, 2.0,
                                                      BoxState.WAITING)})
    with serving(runtime, on_loop=True) as served:
        first = served.request("GET", "/vllm/config", box_headers())
        assert served.app_calls == 1  # the releases had not been read yet
        second = served.request("GET", "/vllm/config", box_headers())
        assert served.app_calls == 1  # read a moment ago: answered on the loop
        assert first == second and first[0] == 200


def test_the_loop_reads_the_releases_again_in_the_background_and_answers_meanwhile(
        runtime: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    """Once a view of the releases is REFRESH_AT into its lifetime the loop starts one read on a thread and
    goes on answering from the view: no request is handed to the app because the view is getting old."""
    served_revision = runtime.tracker.served.revision if runtime.tracker.served else ""
    runtime.store.record_report(BoxReport(KNOWN_BOX, runtime.clock(), "192.0.2.50", served_revision, "test",
                                          ReportOutcome.INSTALLED, freeze_mapping({"agent": True})), keep=5)
    monkeypatch.setattr(rollouts, "REFRESH_AT", 0.0)  # due as soon as read
    cache = release_cache(runtime)
    cache.get()
    first_read = cache.next_read
    reads: list[int] = []
    real = runtime.store.box_releases

    def counted() -> Any:
        reads.append(1)
        return real()

    monkeypatch.setattr(runtime.store, "box_releases", counted)
    with serving(runtime, on_loop=True) as served:
        cache.lock.acquire()  # a read under way: the loop starts no second one and answers from the view
        try:
            assert served.request("GET", "/vllm/config", box_headers())[0] == 200
        finally:
            cache.lock.release()
        assert served.app_calls == 0 and reads == []
        assert served.request("GET", "/vllm/config", box_headers())[0] == 200
        deadline = time.monotonic() + 10
        while not reads and time.monotonic() < deadline:
            time.sleep(0.01)
        assert served.app_calls == 0
    assert len(reads) == 1 and cache.next_read > first_read


def test_connection_headers_for_one_client_are_not_sent_to_the_next(runtime: Runtime) -> None:
    """`Connection` is the server's, per answer (a client closing, or an HTTP/1.0 client keeping alive):
    it never reaches the next client's answer."""
    import socket

    release_cache(runtime).get()
    with serving(runtime, on_loop=True) as served:
        plain = served.request("GET", "/vllm/config", box_headers())
        closing = served.request("GET", "/vllm/config", box_headers(Connection="close"))
        assert ("Connection", "close") in closing[1]
        with socket.create_connection(("127.0.0.1", served.port), timeout=10) as raw:
            lines = [f"{k}: {v}" for k, v in box_headers(Connection="keep-alive").items()]
            raw.sendall(("GET /vllm/config HTTP/1.0\r\n" + "\r\n".join(lines) + "\r\n\r\n").encode())
            head = b""
            while b"\r\n\r\n" not in head:
                head += raw.recv(65536)
        assert b"\r\nConnection: keep-alive\r\n" in head
        assert served.request("GET", "/vllm/config", box_headers()) == plain
        assert not any(k == "Connection" for k, _ in plain[1])
        assert served.app_calls == 0


def _request(headers: dict[str, str]) -> Request:
    return detached_request("/vllm/config", [("Host", "127.0.0.1:8080"), *headers.items()])


def test_a_loop_turns_answers_are_recorded_together_after_it_in_order(
        runtime: Runtime, logs: LogCapture, monkeypatch: pytest.MonkeyPatch) -> None:
    """Answers written in one turn of the event loop are recorded when it ends: their fetch records in
    one hand-over to the store, in the order answered, each with its own time; as many lines and counts."""
    release_cache(runtime).get()
    handed: list[list[tuple[FetchRecord, float]]] = []
    store_records = runtime.store.record_fetches

    def spy(fetches: Any) -> None:
        handed.append(list(fetches))
        store_records(handed[-1])

    monkeypatch.setattr(runtime.store, "record_fetches", spy)
    times = iter(float(t) for t in range(5000, 6000))
    monkeypatch.setattr(runtime, "clock", lambda: next(times))
    asked = [box_headers(), box_headers(key="wrong"), box_headers("198.51.100.23"), box_headers(key=None),
             box_headers(**{"If-None-Match": "*"})]
    statuses: list[int] = []
    counted = {str(s): runtime.metrics.box_requests.labels("config", str(s))._value.get() for s in (200, 304, 403)}
    box = BoxLoop(runtime, ThreadPoolExecutor(1))

    async def one_turn() -> None:
        for headers in asked:
            answer = box.answer(_request(headers))
            assert answer is not None
            statuses.append(answer.status)
        assert handed == []  # not within the turn
        await asyncio.sleep(0)

    asyncio.run(one_turn())
    assert statuses == [200, 403, 200, 403, 304]
    assert len(handed) == 1
    assert [(f.status, f.claimed_host, at) for f, at in handed[0]] == [
        (200, KNOWN_BOX, 5000.0), (403, KNOWN_BOX, 5001.0), (200, "198.51.100.23", 5002.0),
        (403, KNOWN_BOX, 5003.0), (304, KNOWN_BOX, 5004.0)]
    stored = runtime.store.recent_fetches(limit=5)[::-1]
    assert [(f.status, f.claimed_host, f.at) for f in stored] == [(f.status, f.claimed_host, at)
                                                                 for f, at in handed[0]]
    lines = logs.events("box request")[-5:]
    assert [(line["status"], line["claimed_host"]) for line in lines] == [(f.status, f.claimed_host)
                                                                          for f, _ in handed[0]]
    after = {str(s): runtime.metrics.box_requests.labels("config", str(s))._value.get() for s in (200, 304, 403)}
    assert {s: after[s] - counted[s] for s in after} == {"200": 2, "304": 1, "403": 2}


def test_the_answers_of_the_last_turn_are_recorded_when_the_server_stops(runtime: Runtime) -> None:
    """What the server calls as it stops (httpserver._serve) records answers no turn's end recorded."""
    release_cache(runtime).get()
    box = BoxLoop(runtime, ThreadPoolExecutor(1))
    before = len(runtime.store.recent_fetches(limit=1000))

    async def answer_and_stop() -> None:
        assert box.answer(_request(box_headers())) is not None
        box.record()  # before the turn ends: as the server's `finally` runs

    asyncio.run(answer_and_stop())
    assert len(runtime.store.recent_fetches(limit=1000)) == before + 1
    box.record()  # nothing left: nothing recorded twice
    assert len(runtime.store.recent_fetches(limit=1000)) == before + 1


def test_answers_recorded_together_keep_their_order_across_log_levels(runtime: Runtime, logs: LogCapture) -> None:
    """A 503 between two 200s is logged at WARNING between their INFO lines, and stored between them."""
    from fleetllm.adapters.state.records import BoxApi
    from fleetllm.server.boxcontract import BoxCall, record_answers

    answers = []
    for n, status in enumerate((200, 503, 200)):
        call = BoxCall(runtime, BoxApi.CONFIG, f"198.51.100.{n}", None, "127.0.0.1")
        call.resolve()
        answers.append((call, status, None, 7000.0 + n, time.time(), time.perf_counter()))
    record_answers(runtime, answers)
    lines = logs.events("box request")[-3:]
    assert [(line["claimed_host"], line["level"]) for line in lines] == [
        ("198.51.100.0", "info"), ("198.51.100.1", "warning"), ("198.51.100.2", "info")]
    assert [(f.claimed_host, f.status, f.at) for f in runtime.store.recent_fetches(limit=3)[::-1]] == [
        ("198.51.100.0", 200, 7000.0), ("198.51.100.1", 503, 7001.0), ("198.51.100.2", 200, 7002.0)]
