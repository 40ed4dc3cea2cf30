"""Structured JSON logs: one object per line, fields clipped, buffered writes flushed on close."""

from __future__ import annotations

import io
import json
import logging

from fleetllm.logs import MAX_FIELD, BufferedStreamHandler, JsonFormatter, log_event


def test_buffered_handler_writes_every_line_in_order_by_close() -> None:
    stream = io.StringIO()
    handler = BufferedStreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("fleetllm.test-buffered")
    logger.propagate = False
    logger.setLevel(logging.INFO)  # not the `fleetllm` logger's, which depends on what ran before
    logger.addHandler(handler)
    try:
        for i in range(300):
            log_event(logger, "box request", status=200, n=i, header="x" * (MAX_FIELD + 10))
    finally:
        logger.removeHandler(handler)
        handler.close()
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

    stream = io.StringIO()
    handler = BufferedStreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("fleetllm.test-lockfree")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    handler.acquire()  # held, as by another thread in the middle of an emit
    try:
        logging_thread = threading.Thread(target=lambda: log_event(logger, "box request", n=1), daemon=True)
        logging_thread.start()
        logging_thread.join(timeout=30)
        assert not logging_thread.is_alive(), "logging waited on the handler's lock"
    finally:
        handler.release()
        logger.removeHandler(handler)
        handler.close()
    assert json.loads(stream.getvalue())["n"] == 1


def test_timestamps_stay_exact_across_seconds_in_any_order() -> None:
    """iso_utc keeps the last whole second formatted: a record of another second, later or earlier
    (threads log out of order), gets its own."""
    import time

    from fleetllm_contract.logfmt import iso_utc

    for created in (1_764_689_974.880, 1_764_689_974.999, 1_764_689_975.0, 1_764_689_974.5, 0.25, 1_764_689_975.001):
        expected = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created)) + f".{int(created % 1 * 1000):03d}Z"
        assert iso_utc(created) == expected
