"""Structured logs: one JSON object per line on stderr, one line per event.

Callers pass fields explicitly (`log_event(log, "fetch", status=200, ...)`); nothing reaches a log
line implicitly, which is how secrets stay out: no field ever carries a key, token, salt or bearer.
"""

from __future__ import annotations

import json
import logging
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


def setup_logging(stream: IO[str] | None = None, level: int = logging.INFO) -> None:
    """Route the `llmfleet` loggers to `stream` (stderr) as JSON lines. Safe to call twice."""
    root = logging.getLogger(LOGGER)
    root.setLevel(level)
    root.propagate = False
    for handler in list(root.handlers):
        if getattr(handler, "_llmfleet", False):
            root.removeHandler(handler)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    handler._llmfleet = True  # type: ignore[attr-defined]
    root.addHandler(handler)
