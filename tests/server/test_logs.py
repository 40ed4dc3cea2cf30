"""Structured JSON logs: one object per line, fields clipped, buffered writes flushed on close."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from fleetllm.logs import MAX_FIELD, BufferedStreamHandler, JsonFormatter, log_event


@contextmanager
def buffered_logger(name: str) -> Iterator[tuple[logging.Logger, BufferedStreamHandler, io.StringIO]]:
    """A logger of its own at INFO (not the `fleetllm` logger's level, which depends on what ran before)
    writing through the server's BufferedStreamHandler to a string; the handler is closed (every line
    written) on the way out."""
    stream = io.StringIO()
    handler = BufferedStreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger(name)
    logger.propagate = False
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        yield logger, handler, stream
    finally:
        logger.removeHandler(handler)
        handler.close()


def test_buffered_handler_writes_every_line_in_order_by_close() -> None:
    with buffered_logger("fleetllm.test-buffered") as (logger, _, stream):
        for i in range(300):
            log_event(logger, "box request", status=200, n=i, header="x" * (MAX_FIELD + 10))
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [line["n"] for line in lines] == list(range(300))
    assert lines[0]["event"] == "box request"
    assert lines[0]["level"] == "info"
    assert lines[0]["ts"].endswith("Z")
    assert lines[0]["header"].startswith("x" * MAX_FIELD)
    assert lines[0]["header"].endswith("...(+10 chars)")


def test_a_request_thread_logs_without_taking_the_handlers_lock() -> None:
    """The server's handler only queues a record: a thread logging never waits on logging's per-handler
    lock (request threads used to queue on it), even while something else holds it."""
    import threading

    with buffered_logger("fleetllm.test-lockfree") as (logger, handler, stream):
        handler.acquire()  # held, as by another thread in the middle of an emit
        try:
            logging_thread = threading.Thread(target=lambda: log_event(logger, "box request", n=1), daemon=True)
            logging_thread.start()
            logging_thread.join(timeout=30)
            assert not logging_thread.is_alive(), "logging waited on the handler's lock"
        finally:
            handler.release()
    assert json.loads(stream.getvalue())["n"] == 1


def test_timestamps_stay_exact_across_seconds_in_any_order() -> None:
    """iso_utc keeps the last whole second formatted: a record of another second, later or earlier
    (threads log out of order), gets its own."""
    import time

    from fleetllm_contract.logfmt import iso_utc

    for created in (1_764_689_974.880, 1_764_689_974.999, 1_764_689_975.0, 1_764_689_974.5, 0.25, 1_764_689_975.001):
        expected = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created)) + f".{int(created % 1 * 1000):03d}Z"
        assert iso_utc(created) == expected


def test_the_direct_path_writes_the_line_logging_would_and_steps_aside_for_filters_and_other_handlers() -> None:
    """log_event puts a line straight on the server's handler (no LogRecord) only when that handler alone
    would write it: the line is the one the LogRecord path writes, field for field."""
    from fleetllm.logs import _direct_sink

    child = logging.getLogger("fleetllm.test-direct.access")
    fields = {"status": 503, "box": None, "ts": "a field named like a core key", "long": "y" * (MAX_FIELD + 3)}
    with buffered_logger("fleetllm.test-direct") as (_, handler, stream):
        try:
            assert _direct_sink(child, logging.WARNING) is handler
            log_event(child, "box request", logging.WARNING, **fields)
            log_event(child, "not written", logging.DEBUG)
            captured: list[logging.LogRecord] = []
            other = logging.Handler()
            other.emit = captured.append  # type: ignore[method-assign]
            child.addHandler(other)
            assert _direct_sink(child, logging.WARNING) is None  # another handler sees the record: the slow path
            log_event(child, "box request", logging.WARNING, **fields)
            child.removeHandler(other)
            child.addFilter(lambda record: False)
            assert _direct_sink(child, logging.WARNING) is None
            log_event(child, "filtered out", logging.WARNING)
        finally:
            child.filters.clear()
    direct, through_logging = (json.loads(line) for line in stream.getvalue().splitlines())
    assert len(captured) == 1 and captured[0].levelno == logging.WARNING
    assert direct.pop("ts").endswith("Z") and through_logging.pop("ts").endswith("Z")
    assert direct == through_logging
    assert direct["level"] == "warning" and direct["logger"] == "fleetllm.test-direct.access"
    assert direct["ts_"] == "a field named like a core key" and direct["long"].endswith("...(+3 chars)")
    assert list(direct)[:3] == ["level", "logger", "event"]


def test_a_line_that_cannot_be_formatted_is_reported_as_logging_reports_it_and_the_next_lines_are_written(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The direct path has no LogRecord: a line whose formatting raises is still handed to logging's
    handleError (stderr, under logging.raiseExceptions), naming its logger and event, and the batch goes on."""

    class Unprintable:
        def __str__(self) -> str:
            raise RuntimeError("no text")

    reported: list[logging.LogRecord] = []
    with buffered_logger("fleetllm.test-unformattable") as (logger, handler, stream):
        monkeypatch.setattr(handler, "handleError", reported.append)
        log_event(logger, "before", n=1)
        log_event(logger, "box request", value=Unprintable())
        log_event(logger, "after", n=2)
    assert [json.loads(line)["event"] for line in stream.getvalue().splitlines()] == ["before", "after"]
    assert [(r.name, r.getMessage(), r.levelno) for r in reported] == [
        ("fleetllm.test-unformattable", "box request", logging.INFO)]


class Shown:
    def __str__(self) -> str:
        return 'shown by str() "as JSON has no type for it"'


VALUES: list[object] = [None, 0, -7, 10**30, 0.1, 1.5, -2.0, 1e-7, 1e22, 123456.78, float("nan"), float("inf"),
                        -float("inf"), True, False, "", "plain", "x" * (MAX_FIELD + 9), "é ☃ \U0001f600 中文" * 60,
                        'q"uo\\te \n\r\t \x00 \x1f \x7f \u2028', [1, "a", None], {"k": [1.5]}, Shown()]
KEYS = ["status", "level", "ts", "event", "logger", "level_", "exception", "ms", "é", 'k"ey\n']


def line_as_before(created: float, level: str, logger: str, event: str, fields: dict[str, object],
                   exception: str | None = None) -> str:
    """format_event as it was: the whole line one dict, encoded at once."""
    import json

    from fleetllm_contract.logfmt import CORE_KEYS, iso_utc

    def clip(value: object) -> object:
        if isinstance(value, str) and len(value) > MAX_FIELD:
            return value[:MAX_FIELD] + f"...(+{len(value) - MAX_FIELD} chars)"
        return value

    payload: dict[str, object] = {"ts": iso_utc(created), "level": level, "logger": logger, "event": clip(event)}
    payload.update({f"{k}_" if k in CORE_KEYS else k: clip(v) for k, v in fields.items()})
    if exception is not None:
        payload["exception"] = exception
    return json.dumps(payload, default=str, separators=(",", ":"))


def test_prepared_fields_give_the_line_plain_fields_give_byte_for_byte() -> None:
    """EncodedFields (JSON encoded once, `plus` one field) and plain fields: each line is the one format_event
    wrote before, every byte, key order included, for values of every kind and keys named like core keys."""
    from fleetllm_contract.logfmt import EncodedFields, format_event

    created = 1_764_689_974.880
    checked = 0
    for i, value in enumerate(VALUES):
        other = VALUES[(i + 5) % len(VALUES)]
        for key in KEYS:
            base = {"endpoint": "config", "other": other}
            fields = {**base, key: value}
            for event in ("box request", "e" * (MAX_FIELD + 1), 'é "quoted"\n'):
                for exception in (None, "ValueError"):
                    expected = line_as_before(created, "warning", "fleetllm.access", event, fields, exception)
                    for given in (fields, EncodedFields(fields), EncodedFields(base).plus(key, value)):
                        assert format_event(created, "warning", "fleetllm.access", event, given, exception) == expected
                        checked += 1
    assert checked == len(VALUES) * len(KEYS) * 3 * 2 * 3
    assert format_event(created, "info", "x", "e", EncodedFields({})) == line_as_before(created, "info", "x", "e", {})
    plus = EncodedFields({}).plus("ms", 0.25)
    assert format_event(created, "info", "x", "e", plus) == line_as_before(created, "info", "x", "e", {"ms": 0.25})


def test_plus_copies_and_leaves_the_fields_it_was_given_as_they_were() -> None:
    from fleetllm_contract.logfmt import EncodedFields

    base = EncodedFields({"status": 200, "box": "b"})
    first, second = base.plus("ms", 1.25), base.plus("ms", 3.0)
    assert base == {"status": 200, "box": "b"} and base.text == '"status":200,"box":"b"'
    assert first == {"status": 200, "box": "b", "ms": 1.25} and first.text == base.text + ',"ms":1.25'
    assert second.text == base.text + ',"ms":3.0'
    replaced = base.plus("status", 304)  # a field it has: replaced where it is, as a dict would
    assert list(replaced.items()) == [("status", 304), ("box", "b")] and replaced.text == '"status":304,"box":"b"'


def test_a_non_string_key_named_like_a_core_key_never_overrides_it() -> None:
    import json

    from fleetllm_contract.logfmt import format_event

    class Named:
        def __str__(self) -> str:
            return "level"

    line = json.loads(format_event(0.0, "info", "x", "e", {Named(): "field"}))
    assert line["level"] == "info" and line["level_"] == "field"


def test_log_fields_carries_prepared_fields_to_the_writer_and_any_other_handler_sees_a_plain_mapping() -> None:
    """The direct path and the LogRecord path write the line log_event writes with the same fields, and
    a handler of its own (a filter, caplog) gets the fields as a mapping."""
    from fleetllm.logs import _direct_sink, log_fields
    from fleetllm_contract.logfmt import EncodedFields, TextFormatter

    child = logging.getLogger("fleetllm.test-prepared.access")
    fields = {"status": 200, "ts": "a core key's name", "forwarded_for": "z" * (MAX_FIELD + 4), "box": None}
    prepared = EncodedFields({k: v for k, v in fields.items() if k != "box"}).plus("box", None)
    captured: list[logging.LogRecord] = []
    with buffered_logger("fleetllm.test-prepared") as (_, handler, stream):
        assert _direct_sink(child, logging.INFO) is handler
        log_event(child, "box request", logging.INFO, **fields)
        log_fields(child, "box request", logging.INFO, prepared)  # straight to the handler's queue
        other = logging.Handler()
        other.emit = captured.append  # type: ignore[method-assign]
        child.addHandler(other)
        try:
            log_fields(child, "box request", logging.INFO, prepared)  # as a LogRecord
        finally:
            child.removeHandler(other)
    lines = [line.split(",", 1)[1] for line in stream.getvalue().splitlines()]  # without `ts`
    assert len(lines) == 3 and lines[0] == lines[1] == lines[2]
    assert dict(captured[0].fields) == fields  # type: ignore[attr-defined]
    assert TextFormatter("fleetllm").format(captured[0]).startswith("fleetllm: box request (status=200 ts_=")


def test_log_lines_hands_a_batch_to_the_writer_each_line_at_its_time_and_else_logs_them_one_by_one() -> None:
    """log_lines writes what log_fields would for each (time, fields), in order, each stamped with its own
    time; with another handler on the way, each line reaches it as a record."""
    from fleetllm.logs import log_fields, log_lines
    from fleetllm_contract.logfmt import EncodedFields

    child = logging.getLogger("fleetllm.test-lines.access")
    batch = [(1_700_000_000.25 + i, EncodedFields({"status": 200, "n": i})) for i in range(3)]
    captured: list[logging.LogRecord] = []
    with buffered_logger("fleetllm.test-lines") as (_, _, stream):
        log_lines(child, "box request", logging.INFO, batch)
        log_lines(child, "box request", logging.INFO, [])
        log_lines(child, "box request", logging.DEBUG, batch)  # below the logger's level: nothing
        log_fields(child, "box request", logging.INFO, batch[0][1])
        other = logging.Handler()
        other.emit = captured.append  # type: ignore[method-assign]
        child.addHandler(other)
        try:
            log_lines(child, "box request", logging.WARNING, batch)
        finally:
            child.removeHandler(other)
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [(line["ts"], line["n"], line["level"]) for line in lines[:3]] == [
        ("2023-11-14T22:13:20.250Z", 0, "info"), ("2023-11-14T22:13:21.250Z", 1, "info"),
        ("2023-11-14T22:13:22.250Z", 2, "info")]
    assert {k: v for k, v in lines[3].items() if k != "ts"} == {k: v for k, v in lines[0].items() if k != "ts"}
    assert [(line["n"], line["level"]) for line in lines[4:]] == [(0, "warning"), (1, "warning"), (2, "warning")]
    assert [dict(r.fields)["n"] for r in captured] == [0, 1, 2]  # type: ignore[attr-defined]
