"""The one log format of every fleetllm process, defined once: JSON lines.

    {"ts":"2026-12-01T15:39:34.880Z","level":"info","logger":"fleetllm.http","event":"request",...fields}

`ts` is ISO-8601 UTC with milliseconds, `level` one of LEVELS, `logger` the component (a logging
logger's name), `event` what happened; the record's `fields` (passed as `extra={"fields": {...}}`) follow,
never overriding those four. The control plane (fleetllm.logs), the installer, the box agent and the
gateway all format with `JsonLineFormatter`; a shell script or a single-file program that cannot import
this writes the same four keys itself (the provisioning scripts, fleetllm-launch).

The level comes from `--log-level`, else FLEETLLM_LOG_LEVEL, else the caller's default (`resolve_level`).
Standard library only: this ships in the box zipapp and runs with `python3 -S`.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
from collections.abc import Mapping
from typing import IO, Any

LEVELS = ("debug", "info", "warning", "error", "critical")
LEVEL_ENV = "FLEETLLM_LOG_LEVEL"
FORMATS = ("json", "text")
CORE_KEYS = ("ts", "level", "logger", "event")
CORE_KEYS_SET = frozenset(CORE_KEYS)
MAX_FIELD = 512  # values can be client-controlled (headers): cap what one of them puts in a line


_last_second: tuple[int, str] = (-1, "")  # the last whole second formatted (a busy server logs many a second)
_ENCODER = json.JSONEncoder(default=str, separators=(",", ":"))  # one encoder, not one a line


def iso_utc(created: float) -> str:
    """ISO-8601 UTC with milliseconds and a Z: 2026-12-01T15:39:34.880Z."""
    global _last_second
    second = int(created)
    last = _last_second  # read once: another thread may replace it (a tuple, swapped whole)
    if last[0] != second:
        last = _last_second = (second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second)))
    return last[1] + f".{int(created % 1 * 1000):03d}Z"


def _clip(value: Any) -> Any:
    if isinstance(value, str) and len(value) > MAX_FIELD:
        return value[:MAX_FIELD] + f"...(+{len(value) - MAX_FIELD} chars)"
    return value


def clipped_fields(fields: object) -> dict[str, Any]:
    """`fields` (a mapping) as a line carries them: clipped, a field named like a core key with a trailing
    underscore."""
    if not isinstance(fields, Mapping):
        return {}
    out: dict[str, Any] = {}
    for key, value in fields.items():
        if key.__class__ is not str or key in CORE_KEYS_SET:
            key = str(key)
            if key in CORE_KEYS_SET:
                key = f"{key}_"
        if isinstance(value, str) and len(value) > MAX_FIELD:
            value = _clip(value)
        out[key] = value
    return out


def record_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The record's fields (`extra={"fields": ...}`), clipped (`clipped_fields`)."""
    return clipped_fields(getattr(record, "fields", None))


class EncodedFields(dict[str, Any]):
    """Fields whose JSON is written once, for lines that repeat them (every poll of a box): `text` holds
    their members as format_event writes them (clipped, `"key":value,...` without the braces), and
    format_event copies it into the line instead of encoding them again. Not to be changed once built
    (`text` would no longer match): `plus` gives a copy with one field more."""

    __slots__ = ("text",)

    def __init__(self, fields: Mapping[str, Any]) -> None:
        super().__init__(fields)
        self.text = _ENCODER.encode(clipped_fields(self))[1:-1]

    def plus(self, key: str, value: Any) -> EncodedFields:
        """These fields and `key` last: the dict copied and one member appended to `text` (what a
        request adds to its memoized fields, its duration, costs no encoding of the others)."""
        if key.__class__ is not str or key in CORE_KEYS_SET or key in self:  # renamed, or replacing one
            return EncodedFields({**self, key: value})
        out = EncodedFields.__new__(EncodedFields)
        dict.update(out, self)
        out[key] = value
        member = f"{_ENCODER.encode(key)}:{_encoded_value(value)}"
        out.text = f"{self.text},{member}" if self.text else member
        return out


def _encoded_value(value: Any) -> str:
    """`value` (clipped) as _ENCODER writes it. An int or a finite float is its repr, as the encoder writes
    it, without a call to the encoder (which costs several times as much)."""
    if value.__class__ is int or (value.__class__ is float and math.isfinite(value)):
        return repr(value)
    return _ENCODER.encode(_clip(value))


def format_event(created: float, level: str, logger: str, event: str, fields: object,
                 exception: str | None = None) -> str:
    """One JSON line: the four core keys (`level` in lower case), then `fields` (`clipped_fields`, or an
    EncodedFields' `text`), then the exception's type when there is one. The core keys are encoded one by
    one (a dict's encoding is its members' joined): a third of what encoding them as a dict costs."""
    if isinstance(fields, EncodedFields) and exception is None:
        members = fields.text
    else:
        payload = clipped_fields(fields) if fields else {}
        if exception is not None:
            payload["exception"] = exception  # the type only: a message may quote input
        members = _ENCODER.encode(payload)[1:-1]
    encode = _ENCODER.encode
    return (f'{{"ts":"{iso_utc(created)}","level":{encode(level)},"logger":{encode(logger)},'
            f'"event":{encode(_clip(event))}{"," if members else ""}{members}}}')


class JsonLineFormatter(logging.Formatter):
    """One JSON object per record, on one line (the message's own newlines are escaped by JSON)."""

    def format(self, record: logging.LogRecord) -> str:
        exc = record.exc_info[0] if record.exc_info else None
        return format_event(record.created, record.levelname.lower(), record.name, record.getMessage(),
                            getattr(record, "fields", None), exc.__name__ if exc is not None else None)


class TextFormatter(logging.Formatter):
    """For a person at a terminal: `prog: event key=value ...` (levels above info named)."""

    def __init__(self, prog: str) -> None:
        super().__init__()
        self.prog = prog

    def format(self, record: logging.LogRecord) -> str:
        level = "" if record.levelno <= logging.INFO else f"{record.levelname.lower()}: "
        fields = " ".join(f"{k}={v}" for k, v in record_fields(record).items())
        return f"{self.prog}: {level}{record.getMessage()}" + (f" ({fields})" if fields else "")


def parse_level(text: str) -> int:
    """A level name (any case) as a logging level; ValueError naming the allowed ones."""
    name = text.strip().lower()
    if name not in LEVELS:
        raise ValueError(f"unknown log level {text!r}: use one of {', '.join(LEVELS)}")
    return int(getattr(logging, name.upper()))


def resolve_level(flag: str | None, env: Mapping[str, str] | None = None, default: str = "info") -> int:
    """`--log-level` if given, else FLEETLLM_LOG_LEVEL if set, else `default`. ValueError when unknown
    (the message names where the bad value came from)."""
    environ = os.environ if env is None else env
    for where, value in (("--log-level", flag), (LEVEL_ENV, environ.get(LEVEL_ENV, "").strip() or None),
                         ("the default", default)):
        if value is not None:
            try:
                return parse_level(value)
            except ValueError as exc:
                raise ValueError(f"{where}: {exc}") from None
    raise AssertionError("the default is never None")


def add_level_argument(parser: Any) -> None:
    """`--log-level LEVEL` on an argparse parser (default: FLEETLLM_LOG_LEVEL, else info)."""
    parser.add_argument("--log-level", choices=LEVELS, type=str.lower, metavar="LEVEL",
                        help=f"the lowest level logged: {', '.join(LEVELS)} (default: ${LEVEL_ENV}, else info)")


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever sys.stderr is when a line is written (as logging's own last-resort handler
    does), not the stream it was at set-up: a replaced or closed stderr then never loses a line."""

    def __init__(self) -> None:
        logging.Handler.__init__(self)

    @property
    def stream(self) -> IO[str]:
        return sys.stderr


def configure(logger: logging.Logger, level: int, *, fmt: str = "json", prog: str = "fleetllm",
              stream: IO[str] | None = None) -> logging.Handler:
    """Send `logger`'s records at `level` and above to `stream` (stderr) in `fmt`, replacing any handler
    an earlier call added. Returns the handler."""
    for old in list(logger.handlers):
        if getattr(old, "_fleetllm_logfmt", False):
            logger.removeHandler(old)
            old.close()
    handler: logging.Handler = logging.StreamHandler(stream) if stream is not None else _StderrHandler()
    handler.setFormatter(JsonLineFormatter() if fmt == "json" else TextFormatter(prog))
    handler._fleetllm_logfmt = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.setLevel(level)
    return handler
