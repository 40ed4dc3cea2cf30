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
