"""Structured logs: one JSON object per line on stderr, one line per event, in the format every
fleetllm process writes (fleetllm_contract.logfmt: ts, level, logger, event, then the fields).

Callers pass fields explicitly (`log_event(log, "fetch", status=200, ...)`, or a mapping they built to
`log_fields`); nothing reaches a log line implicitly, which is how secrets stay out: no field ever
carries a key, token, salt or bearer.
"""

from __future__ import annotations

import logging
import queue
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any

from fleetllm_contract.logfmt import MAX_FIELD, JsonLineFormatter, format_event, resolve_level

__all__ = ["LOGGER", "MAX_FIELD", "BufferedStreamHandler", "Events", "JsonFormatter", "get_logger", "log_event",
           "log_fields", "log_lines", "resolve_level", "set_level", "setup_logging"]

LOGGER = "fleetllm"
JsonFormatter = JsonLineFormatter  # the one format, defined in the box contract (fleetllm_contract.logfmt)


Event = tuple[float, int, str, str, Mapping[str, Any]]  # a line log_fields puts straight on the handler's queue


@dataclass(frozen=True, slots=True)
class Events:
    """Lines of one event that log_lines puts on the handler's queue at once: each (time, fields)."""

    level: int
    logger: str
    event: str
    lines: Sequence[tuple[float, Mapping[str, Any]]]


def get_logger(name: str) -> logging.Logger:
    return logging.getLogger(f"{LOGGER}.{name}")


def log_event(logger: logging.Logger, event: str, level: int = logging.INFO, **fields: Any) -> None:
    """Log `event` with `fields` (log_fields)."""
    log_fields(logger, event, level, fields)


def log_fields(logger: logging.Logger, event: str, level: int, fields: Mapping[str, Any]) -> None:
    """Log `event` with `fields`, a mapping the caller built: an EncodedFields (fleetllm_contract.logfmt)
    reaches the writer thread as it is, which then writes its JSON without encoding it again. When the
    one handler the line would reach is the server's BufferedStreamHandler (no filter on the way), the
    line goes to it without a LogRecord built and passed through logging's machinery: what each box
    request used to spend most of its logging on."""
    if not logger.isEnabledFor(level):
        return
    sink = _direct_sink(logger, level)
    if sink is None:
        logger.log(level, event, extra={"fields": fields})
    else:
        sink.put_event((time.time(), level, logger.name, event, fields))


def log_lines(logger: logging.Logger, event: str, level: int, lines: Sequence[tuple[float, Mapping[str, Any]]]) -> None:
    """log_fields for each (time, fields) of `lines`, in order, each line at its time: handed to the
    server's BufferedStreamHandler at once when it alone would write them (what a loop turn of box
    requests logs), else line by line through logging (stamped with the time they are logged)."""
    if not lines or not logger.isEnabledFor(level):
        return
    sink = _direct_sink(logger, level)
    if sink is None:
        for _, fields in lines:
            logger.log(level, event, extra={"fields": fields})
    else:
        sink.put_event(Events(level, logger.name, event, lines))


def _direct_sink(logger: logging.Logger, level: int) -> BufferedStreamHandler | None:
    """The BufferedStreamHandler that alone would write a `level` line of `logger`, if that is all that would
    happen to it (no filter on a logger or the handler, no other handler); else None."""
    found: BufferedStreamHandler | None = None
    current: logging.Logger | None = logger
    while current is not None:
        if current.filters:
            return None
        for handler in current.handlers:
            if found is not None or not isinstance(handler, BufferedStreamHandler) or handler.filters or \
                    level < handler.level or handler.formatter.__class__ is not JsonLineFormatter:
                return None
            found = handler
        if not current.propagate:
            break
        current = current.parent
    return found


class BufferedStreamHandler(logging.Handler):
    """Queues each record and formats and writes it from one background thread, a batch of lines per
    write: a request never waits on its log stream, and takes no lock to log (the queue is a
    SimpleQueue, and `handle` skips logging's per-handler lock, which every request thread used to
    queue on). Lines are at most FLUSH_INTERVAL_S late and are written out at exit (logging.shutdown
    closes every handler)."""

    FLUSH_INTERVAL_S = 0.2

    def __init__(self, stream: IO[str]) -> None:
        super().__init__()
        self.stream = stream
        # LogRecords, and events put by log_fields: (time, level, logger, event, fields)
        self._records: queue.SimpleQueue[logging.LogRecord | Event | Events] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._write_lock = threading.Lock()  # the writer thread and close() (never a request)
        self._writer: threading.Thread | None = None
        self._starting = threading.Lock()

    def handle(self, record: logging.LogRecord) -> bool:
        """logging.Handler.handle without the handler's lock: emit only queues the record."""
        if not self.filter(record):
            return False
        self.emit(record)
        return True

    def emit(self, record: logging.LogRecord) -> None:
        self.put_event(record)

    def put_event(self, record: logging.LogRecord | Event | Events) -> None:
        self._records.put(record)
        if self._writer is None:
            with self._starting:
                if self._writer is None:
                    self._writer = threading.Thread(target=self._write_loop, name="fleetllm-log", daemon=True)
                    self._writer.start()

    def _write_loop(self) -> None:
        while not self._stop.wait(self.FLUSH_INTERVAL_S):
            self.flush()

    def flush(self) -> None:
        with self._write_lock:
            lines: list[str] = []
            while True:
                try:
                    record = self._records.get_nowait()
                except queue.Empty:
                    break
                if isinstance(record, Events):
                    level_name = logging.getLevelName(record.level).lower()
                    for created, fields in record.lines:
                        self._format_into(lines, (created, record.level, record.logger, record.event, fields),
                                          level_name)
                else:
                    self._format_into(lines, record)
            if lines:
                try:
                    self.stream.write("\n".join(lines) + "\n")
                    self.stream.flush()
                except (OSError, ValueError):  # the stream is gone (closed at exit): nothing left to tell
                    pass

    def _format_into(self, lines: list[str], record: logging.LogRecord | Event, level_name: str | None = None) -> None:
        """Append `record`'s line to `lines`; a line that cannot be formatted is reported as logging does."""
        try:
            if isinstance(record, tuple):
                created, level, name, event, fields = record
                lines.append(format_event(created, level_name or logging.getLevelName(level).lower(), name, event,
                                          fields))
            else:
                lines.append(self.format(record))
        except Exception:
            if isinstance(record, tuple):  # logging's own report needs a record: built only now
                created, level, name, event, _ = record
                record = logging.LogRecord(name, level, "", 0, event, None, None)
                record.created = created
            self.handleError(record)  # to stderr, as logging reports a line it cannot format

    def close(self) -> None:
        self._stop.set()
        self.flush()
        super().close()


def setup_logging(stream: IO[str] | None = None, level: int = logging.INFO, *, buffered: bool = False) -> None:
    """Route the `fleetllm` loggers to `stream` (stderr) as JSON lines. Safe to call again.

    `buffered`: lines are written in batches by a background thread (the server, so that no request
    waits on a write); otherwise each line is written at once (commands, tests)."""
    root = logging.getLogger(LOGGER)
    root.setLevel(level)
    root.propagate = False
    for old in list(root.handlers):
        if getattr(old, "_fleetllm", False):
            root.removeHandler(old)
            old.close()
    target = stream or sys.stderr
    if buffered:
        # The server: no record looks up its caller's frame, thread or process (the logging HOWTO's
        # "Optimization"); the JSON lines never show them, and every box request writes one.
        logging._srcfile = None
        logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    handler: logging.Handler = BufferedStreamHandler(target) if buffered else logging.StreamHandler(target)
    handler.setFormatter(JsonFormatter())
    handler._fleetllm = True  # type: ignore[attr-defined]
    root.addHandler(handler)


def set_level(level: int) -> None:
    """Change the level of every `fleetllm` logger (after the config named one)."""
    logging.getLogger(LOGGER).setLevel(level)
