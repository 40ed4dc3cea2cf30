"""Structured logs: one JSON object per line on stderr, one line per event.

Callers pass fields explicitly (`log_event(log, "fetch", status=200, ...)`); nothing reaches a log
line implicitly, which is how secrets stay out: no field ever carries a key, token, salt or bearer.
"""

from __future__ import annotations

import atexit
import json
import logging
import logging.handlers
import queue
import sys
import time
from typing import IO, Any

LOGGER = "llmfleet"
MAX_FIELD = 512  # header values are client-controlled: cap what one of them can put in a line


def _clip(value: Any) -> Any:
    if isinstance(value, str) and len(value) > MAX_FIELD:
        return value[:MAX_FIELD] + f"...(+{len(value) - MAX_FIELD} chars)"
    return value


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "event": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            payload.update({k: _clip(v) for k, v in fields.items()})
        if record.exc_info and record.exc_info[0] is not None:
            payload["exception"] = record.exc_info[0].__name__
        return json.dumps(payload, default=str, separators=(",", ":"))


def get_logger(name: str) -> logging.Logger:
    return logging.getLogger(f"{LOGGER}.{name}")


def log_event(logger: logging.Logger, event: str, level: int = logging.INFO, **fields: Any) -> None:
    logger.log(level, event, extra={"fields": fields})


_listener: logging.handlers.QueueListener | None = None


def _stop_listener() -> None:
    global _listener
    if _listener is not None:
        _listener.stop()  # writes out what is queued
        _listener = None


def setup_logging(stream: IO[str] | None = None, level: int = logging.INFO, *, queued: bool = False) -> None:
    """Route the `llmfleet` loggers to `stream` (stderr) as JSON lines. Safe to call again.

    `queued`: request threads only enqueue records; one thread formats and writes them (the server
    does this so that no request waits on a write to its log)."""
    _stop_listener()
    root = logging.getLogger(LOGGER)
    root.setLevel(level)
    root.propagate = False
    for old in list(root.handlers):
        if getattr(old, "_llmfleet", False):
            root.removeHandler(old)
    output = logging.StreamHandler(stream or sys.stderr)
    output.setFormatter(JsonFormatter())
    handler: logging.Handler = output
    if queued:
        records: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
        handler = logging.handlers.QueueHandler(records)
        global _listener
        _listener = logging.handlers.QueueListener(records, output)
        _listener.start()
        atexit.register(_stop_listener)
    handler._llmfleet = True  # type: ignore[attr-defined]
    root.addHandler(handler)
