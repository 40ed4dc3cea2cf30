"""What a box request records (server/boxrecords.py): each kind of answer's fetch record and `box request`
fields are built once and reused, and what is stored and logged is what building them every time stored
and logged; the memo stays bounded whatever a client sends."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from flask.testing import FlaskClient

from fleetllm.adapters.state.records import BoxApi, FetchRecord
from fleetllm.logs import MAX_FIELD
from fleetllm.server import boxrecords
from fleetllm.server.app import create_app
from fleetllm.server.boxrecords import MAX_ENTRIES, MAX_TEXT, BoxRecords, Key
from fleetllm.server.runtime import Runtime
from tests.conftest import git
from tests.server.conftest import KNOWN_BOX, LogCapture, box_headers

PEER = "192.0.2.50"


def key(peer: str, revision: str | None = "a" * 40) -> Key:
    return BoxApi.CONFIG, 200, revision, KNOWN_BOX, None, peer, KNOWN_BOX, "x-llmao-host", "replica-1"


def get(client: FlaskClient, runtime: Runtime, at: float, path: str, headers: dict[str, str]) -> Any:
    runtime.clock.now = at  # type: ignore[attr-defined]  # tests.server.conftest.Clock
    return client.get(path, headers=headers, environ_base={"REMOTE_ADDR": PEER})


def line_as_before(status: int, box: str | None, host_source: str | None, claimed: str | None,
                   forwarded_for: str | None, revision: str | None, endpoint: str = "config") -> list[tuple[str, Any]]:
    """The `box request` line BoxCall.record wrote before the memo (its keys in order, `ts` and `ms` left out)."""
    clipped = forwarded_for
    if forwarded_for is not None and len(forwarded_for) > MAX_FIELD:
        clipped = forwarded_for[:MAX_FIELD] + f"...(+{len(forwarded_for) - MAX_FIELD} chars)"
    return [("level", "info" if status < 500 else "warning"), ("logger", "fleetllm.access"), ("event", "box request"),
            ("endpoint", endpoint), ("status", status), ("box", box), ("host_source", host_source),
            ("claimed_host", claimed), ("peer", PEER), ("forwarded_for", clipped), ("revision", revision)]


def test_answers_store_and_log_what_they_did_before_each_kind_built_once(runtime: Runtime, logs: LogCapture) -> None:
    client = create_app(runtime).test_client()
    long_chain = ", ".join(f"198.51.100.{i % 250}" for i in range(60))  # past the stored and the logged caps
    first = get(client, runtime, 1000.0, "/vllm/config", box_headers())
    revision = first.headers["X-Fleet-Revision"]
    get(client, runtime, 1001.0, "/vllm/config", box_headers())  # the same poll: the same record, at its time
    get(client, runtime, 1002.0, "/vllm/config", box_headers(**{"If-None-Match": first.headers["ETag"]}))
    get(client, runtime, 1003.0, "/vllm/config", box_headers(key="wrong-key-wrong-key"))
    get(client, runtime, 1004.0, "/vllm/config", box_headers(**{"X-Forwarded-For": long_chain}))
    get(client, runtime, 1005.0, "/vllm/config", box_headers("unknown.example"))
    get(client, runtime, 1006.0, "/vllm/installer", box_headers())
    get(client, runtime, 1007.0, "/vllm/config", box_headers())
    answers = [  # at, endpoint, status, claimed host, X-Forwarded-For, box, host source, revision
        (1000.0, BoxApi.CONFIG, 200, KNOWN_BOX, None, KNOWN_BOX, "x-llmao-host", revision),
        (1001.0, BoxApi.CONFIG, 200, KNOWN_BOX, None, KNOWN_BOX, "x-llmao-host", revision),
        (1002.0, BoxApi.CONFIG, 304, KNOWN_BOX, None, KNOWN_BOX, "x-llmao-host", revision),
        (1003.0, BoxApi.CONFIG, 403, KNOWN_BOX, None, None, None, None),
        (1004.0, BoxApi.CONFIG, 200, KNOWN_BOX, long_chain, KNOWN_BOX, "x-llmao-host", revision),
        (1005.0, BoxApi.CONFIG, 404, "unknown.example", None, "unknown.example", "x-llmao-host", None),
        (1006.0, BoxApi.INSTALLER, 200, KNOWN_BOX, None, KNOWN_BOX, "x-llmao-host", None),
        (1007.0, BoxApi.CONFIG, 200, KNOWN_BOX, None, KNOWN_BOX, "x-llmao-host", revision),
    ]
    stored = runtime.store.recent_fetches()
    assert stored == [FetchRecord(at=at, endpoint=endpoint, status=status, peer=PEER, claimed_host=claimed,
                                  forwarded_for=forwarded_for, box=box, revision=rev, replica=runtime.replica).bounded()
                      for at, endpoint, status, claimed, forwarded_for, box, _, rev in reversed(answers)]
    assert stored[3].forwarded_for is not None and stored[3].forwarded_for.endswith(f"[truncated: {len(long_chain)} chars]")
    lines = logs.events("box request")
    assert [[(k, v) for k, v in line.items() if k not in ("ts", "ms")] for line in lines] == [
        line_as_before(status, box, source, claimed, forwarded_for, rev, endpoint.value)
        for _, endpoint, status, claimed, forwarded_for, box, source, rev in answers]
    assert all(list(line)[-1] == "ms" and isinstance(line["ms"], float) and line["ms"] >= 0 for line in lines)
    assert len(runtime.box_records) == 5  # the three polls alike share one; the long chain's is not kept


def test_a_new_revision_is_recorded_and_logged_as_itself(runtime: Runtime, logs: LogCapture, fleet_git: Path) -> None:
    client = create_app(runtime).test_client()
    old = get(client, runtime, 1000.0, "/vllm/config", box_headers()).headers["X-Fleet-Revision"]
    with (fleet_git / "placement.yaml").open("a") as fh:
        fh.write("\n  203.0.113.55:\n    - [qwen3-8b, 8001]\n")
    git(fleet_git, "commit", "-qam", "add a box")
    assert runtime.tracker.refresh()
    new = get(client, runtime, 1001.0, "/vllm/config", box_headers()).headers["X-Fleet-Revision"]
    assert new != old
    assert [r.revision for r in runtime.store.recent_fetches()] == [new, old]
    assert [line["revision"] for line in logs.events("box request")] == [old, new]


def test_the_memo_stays_bounded_whatever_peers_a_client_sends() -> None:
    records = BoxRecords()
    for i in range(MAX_ENTRIES + 100):
        assert records.get(key(f"10.{i >> 16}.{i >> 8 & 255}.{i & 255}")).fetch.peer == f"10.{i >> 16}.{i >> 8 & 255}.{i & 255}"
        assert len(records) <= MAX_ENTRIES
    assert len(records) == 100  # emptied when full, refilled since
    assert records.get(key("10.0.0.1", "b" * 40)).fetch.revision == "b" * 40


def test_an_answer_to_long_client_text_is_built_each_time_and_not_kept() -> None:
    records = BoxRecords()
    huge = ", ".join(["198.51.100.7" * 700] * 95)  # 95 X-Forwarded-For headers of 8 kB (tests/faults)
    long: Key = (BoxApi.CONFIG, 403, None, KNOWN_BOX, huge, PEER, None, None, "replica-1")
    record = records.get(long)
    assert record.fetch.bounded().forwarded_for == huge[:512] + f"...[truncated: {len(huge)} chars]"  # as stored
    assert record.fields["forwarded_for"] is huge and len(records) == 0
    assert len(record.fields.text) > MAX_TEXT >= len(records.get(key(PEER)).fields.text)
    assert len(records) == 1


def test_requests_emptying_the_memo_as_others_read_it_never_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(boxrecords, "MAX_ENTRIES", 8)
    records = BoxRecords()
    failures: list[BaseException] = []

    def poll(thread: int) -> None:
        try:
            for i in range(2000):
                peer = f"10.0.{thread}.{i % 50}"
                assert records.get(key(peer)).fetch.peer == peer
        except BaseException as exc:  # reported below, from the test's thread
            failures.append(exc)

    threads = [threading.Thread(target=poll, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not failures
    assert len(records) <= 8 + len(threads)  # a full memo and, at most, one record a thread set past the check
