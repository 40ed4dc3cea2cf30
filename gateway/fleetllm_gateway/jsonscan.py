"""The top-level `model` of a JSON request body, without building the document.

LLMhop decodes the body into a probe with one field, so what it checks is: the body is one JSON
value; a top-level object's `model` (the last of duplicates) is a string; `null` or a missing one is
"missing model"; anything else is "invalid JSON". `json.loads` gives the same answers but builds the
whole document first, in one call that holds the event loop: a 99 MiB body of empty lists became
2.65 GB of Python lists and held the loop for 32 s (issue 16, finding 6).

`scan(body)` reads the same grammar as `json.loads` (strict strings, no NaN/Infinity, invalid UTF-8
allowed inside strings, where the decoder would replace it) with regular expressions over the bytes,
decodes only the `model` value, and keeps one byte per open array or object, at most MAX_DEPTH of
them (Go's encoding/json limit, so LLMhop refuses deeper bodies too). It works in pieces of at most
WINDOW bytes and yields between them, so that `find_model` can let the event loop run. Its cost:

1. escapes: `\\\\` and `\\"` are blanked (same length) in a copy, window by window, and every other
   backslash must start a valid escape; strings in the copy then have no inner quote, and match the
   simple `"[^"\\x00-\\x1f]*"` (Python's regex engine is slow on repeated groups: one regex
   call over 49 M escapes took 80 s);
2. structure: runs of simple elements (`v ,` in arrays, `"k" : v ,` in objects, v nesting at most
   RUN_DEPTH levels) are skipped by one regex call per window, the rest by a small state machine.

Token-dense bodies still cost 2-3 s of CPU per MB in the state machine, so a body with more than
MAX_BRACKETS `[` and `{` bytes (anywhere, strings included: counted at C speed before scanning) is
refused with 413; no LLM request comes near (half a million brackets of text is some 2 M tokens). Large
scans run one at a time, so the loop waits for at most one step of one scan (a few ms).
Small bodies whose bracket count bounds their depth far below the recursion limit go to `json.loads`
at once, which is faster there and gives the same answers (tests/gateway/test_jsonscan.py checks the
two against each other).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable, Generator

from fleetllm_gateway import errors
from fleetllm_gateway.errors import BodyError

MAX_DEPTH = 10_000  # Go's encoding/json maxNestingDepth; the top-level value is level 1
MAX_BRACKETS = 500_000  # '[' and '{' bytes in a body; more: 413
WINDOW = 64 * 1024  # bytes one regex call may cover
RUN_WINDOW = 4 * 1024  # ... and one run: Python's regex engine keeps ~1 KB per repetition until it returns
STEP = 500  # state-machine tokens between two yields (a few ms)
SMALL_BODY = 64 * 1024  # bodies up to this size ...
SMALL_BRACKETS = 400  # ... with at most this many '[' and '{' are handed to json.loads
RUN_DEPTH = 2  # 3 made runs of small containers no faster, and deeper failures slower

Text = bytes | bytearray  # the body, or its copy with escapes blanked
_Match = Callable[..., "re.Match[bytes]"]  # a pattern's match() that cannot fail (every part optional)
_WS: _Match = re.compile(rb"[ \t\n\r]*").match  # type: ignore[assignment]
_STRING_BODY: _Match = re.compile(rb'[^"\x00-\x1f]*').match  # type: ignore[assignment]
_BAD_ESCAPE = re.compile(rb"\\(?![/bfnrt]|u[0-9a-fA-F]{4})")  # after \\ and \" are blanked
_NUMBER = re.compile(rb"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?")
_LITERALS = {0x74: b"true", 0x66: b"false", 0x6E: b"null"}
_QUOTE, _LBRACE, _RBRACE, _LBRACKET, _RBRACKET, _COMMA, _COLON, _BACKSLASH = b'"{}[],:\\'
_MODEL_KEY = b'"model"'
_NOT_STRING = object()  # a `model` value that is neither a string nor null


def _runs() -> tuple[_Match, _Match]:
    ws, string = rb"[ \t\n\r]*", rb'"[^"\x00-\x1f]*"'
    simple = rb"(?:" + string + rb"|" + _NUMBER.pattern + rb"|true|false|null|\[" + ws + rb"\]|\{" + ws + rb"\})"
    for _ in range(RUN_DEPTH - 1):
        member = string + ws + rb":" + ws + simple
        simple = (rb"(?:" + simple + rb"|\[" + ws + simple + rb"(?:" + ws + rb"," + ws + simple + rb")*" + ws + rb"\]"
                  + rb"|\{" + ws + member + rb"(?:" + ws + rb"," + ws + member + rb")*" + ws + rb"\})")
    array_run = re.compile(rb"(?:" + simple + ws + rb"," + ws + rb")*")
    object_run = re.compile(rb"(?:" + string + ws + rb":" + ws + simple + ws + rb"," + ws + rb")*")
    return array_run.match, object_run.match  # type: ignore[return-value]


_ARRAY_RUN, _OBJECT_RUN = _runs()


def _invalid() -> BodyError:
    return BodyError(errors.INVALID_JSON)


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def _ignore_number(literal: str) -> int:
    return 0  # only `model` matters, and numbers are never converted (Go does not either)


def model_of_document(document: object) -> str:
    """LLMhop's answer for a decoded document."""
    if document is None:  # Go decodes `null` into an empty probe: no model
        raise BodyError(errors.MISSING_MODEL)
    if not isinstance(document, dict):
        raise _invalid()
    model = document.get("model")
    if model is None:
        raise BodyError(errors.MISSING_MODEL)
    if not isinstance(model, str):
        raise _invalid()
    return model


def small_enough_for_json(body: Text) -> bool:
    return len(body) <= SMALL_BODY and body.count(b"[") + body.count(b"{") <= SMALL_BRACKETS


# json.loads with these arguments would build a new decoder for every body.
_SMALL_DECODER = json.JSONDecoder(parse_constant=_reject_constant, parse_int=_ignore_number,
                                  parse_float=_ignore_number)
# Its C scanner, called as JSONDecoder.decode calls it but without decode's two Python frames and two
# whitespace regexes: a third of what finding the model costs a request whose caches went cold
# (docs/benchmarks.md, "Ninth round"). JSON's whitespace is these four characters, as json's regex says.
_SCAN: Callable[[str, int], tuple[object, int]] = _SMALL_DECODER.scan_once  # type: ignore[attr-defined]
_JSON_SPACE = " \t\n\r"


def loads_model(body: Text) -> str:
    """json.loads's answer: for small bodies (whose documents are small too)."""
    # Invalid UTF-8 is replaced, not refused, as Go's decoder does.
    text = body.decode("utf-8", "replace")
    if text.startswith("\ufeff"):  # refused, as json.loads refuses it
        raise _invalid()
    try:
        document, end = _SCAN(text, len(text) - len(text.lstrip(_JSON_SPACE)))
    except (StopIteration, ValueError, RecursionError):  # StopIteration: no value where one must start
        raise _invalid() from None
    if text[end:].strip(_JSON_SPACE):  # anything but whitespace after the document
        raise _invalid()
    return model_of_document(document)


def _decode_string(literal: Text) -> str:
    value = json.loads(literal.decode("utf-8", "replace"))
    assert isinstance(value, str)
    return value


def _blank_escapes(body: Text) -> Generator[None, None, Text]:
    """`body` with every `\\\\` and `\\"` replaced by `__`, or BodyError for any other backslash
    that does not start a JSON escape. Same length, so positions carry over."""
    if b"\\" not in body:
        return body
    n, start = len(body), 0
    clean = bytearray(n)  # allocated once: the body and this copy are the scan's memory
    while start < n:
        end = min(n, start + WINDOW)
        while end < n and body[end - 1] == _BACKSLASH:  # never split a run of backslashes
            end += 1
        clean[start:end] = body[start:end].replace(b"\\\\", b"__").replace(b'\\"', b"__")
        start = end
        yield
    for start in range(0, n, WINDOW):
        # A match must start in this window; the 6 bytes after it are there for the look-ahead.
        bad = _BAD_ESCAPE.search(clean, start, min(n, start + WINDOW + 6))
        if bad is not None and bad.start() < start + WINDOW:
            raise _invalid()
        yield
    return clean


def _string_end(text: Text, pos: int) -> Generator[None, None, int]:
    """The position after the string starting at `pos` (a quote) in the blanked text."""
    n = len(text)
    pos += 1
    while True:
        end = _STRING_BODY(text, pos, min(n, pos + WINDOW)).end()
        if end < n and text[end] == _QUOTE:
            return end + 1
        if end < pos + WINDOW or end >= n:
            raise _invalid()  # a control character, or no closing quote
        pos = end
        yield


def scan(body: Text) -> Generator[None, None, str]:
    """The model of `body`, as loads_model would find it, yielding between pieces of work."""
    n = len(body)
    pos = _WS(body, 0).end()
    if pos == n:
        raise _invalid()
    if body[pos] != _LBRACE:
        # Only `null` has an answer other than "invalid JSON": nothing else needs reading.
        if body.startswith(b"null", pos) and _WS(body, pos + 4).end() == n:
            raise BodyError(errors.MISSING_MODEL)
        raise _invalid()
    brackets = 0
    for start in range(0, n, 16 * WINDOW):
        brackets += body.count(b"[", start, start + 16 * WINDOW) + body.count(b"{", start, start + 16 * WINDOW)
        if brackets > MAX_BRACKETS:
            raise BodyError(errors.body_too_complex(MAX_BRACKETS))
        yield
    text = yield from _blank_escapes(body)
    model: object = None
    stack = bytearray()  # the open containers below the top-level object
    pos = _WS(text, pos + 1).end()
    if pos < n and text[pos] == _RBRACE:  # {}
        if _WS(text, pos + 1).end() != n:
            raise _invalid()
        raise BodyError(errors.MISSING_MODEL)
    while True:  # one top-level member per turn: "key" : value , ...
        if pos >= n or text[pos] != _QUOTE:
            raise _invalid()
        end = yield from _string_end(text, pos)
        # "model", or an escaped spelling of it (at most 6 bytes per letter): no copy of long keys
        is_model = (body.startswith(_MODEL_KEY, pos) and end == pos + len(_MODEL_KEY)) or (
            end - pos <= 32 and b"\\" in body[pos:end] and _decode_string(body[pos:end]) == "model")
        pos = _WS(text, end).end()
        if pos >= n or text[pos] != _COLON:
            raise _invalid()
        pos = _WS(text, pos + 1).end()
        if not is_model:
            pos = yield from _skip_value(text, pos, stack)
        elif pos < n and text[pos] == _QUOTE:
            end = yield from _string_end(text, pos)
            model = _decode_string(body[pos:end])
            pos = end
        elif text.startswith(b"null", pos):
            model, pos = None, pos + 4
        else:
            model = _NOT_STRING
            pos = yield from _skip_value(text, pos, stack)
        pos = _WS(text, pos).end()
        if pos >= n:
            raise _invalid()
        if text[pos] == _RBRACE:
            break
        if text[pos] != _COMMA:
            raise _invalid()
        pos = _WS(text, pos + 1).end()
    if _WS(text, pos + 1).end() != n:
        raise _invalid()
    if model is None:
        raise BodyError(errors.MISSING_MODEL)
    if model is _NOT_STRING:
        raise _invalid()
    assert isinstance(model, str)
    return model


def _skip_value(text: Text, pos: int, stack: bytearray) -> Generator[None, None, int]:
    """Validate the value at `pos` (whitespace skipped) of the blanked text; the position after it."""
    n = len(text)
    ws, number, array_run, object_run = _WS, _NUMBER.match, _ARRAY_RUN, _OBJECT_RUN
    work = 0  # tokens, plus one per 32 bytes skipped by a regex
    while True:
        # A value is expected at pos.
        if pos >= n:
            raise _invalid()
        byte = text[pos]
        if byte == _QUOTE:
            end = _STRING_BODY(text, pos + 1, min(n, pos + 1 + WINDOW)).end()
            if end < n and text[end] == _QUOTE:
                work += (end - pos) >> 5
                pos = end + 1
            else:
                pos = yield from _string_end(text, pos)
        elif byte in (_LBRACKET, _LBRACE):
            if len(stack) + 2 > MAX_DEPTH:  # the top-level object, the open ones, this one
                raise _invalid()
            pos = ws(text, pos + 1).end()
            if pos < n and text[pos] == byte + 2:  # [] or {}
                pos += 1
            else:
                stack.append(byte)
                if len(stack) + 1 + RUN_DEPTH <= MAX_DEPTH:
                    start = pos
                    pos = (object_run if byte == _LBRACE else array_run)(text, pos, min(n, pos + RUN_WINDOW)).end()
                    work += (pos - start) >> 5
                    pos = ws(text, pos).end()  # a run cut by the window may end before whitespace
                work += 1
                if byte == _LBRACE:
                    pos = yield from _key(text, pos)
                if work >= STEP:
                    work = 0
                    yield
                continue
        elif byte in _LITERALS:
            literal = _LITERALS[byte]
            if not text.startswith(literal, pos):
                raise _invalid()
            pos += len(literal)
        else:
            m = number(text, pos)
            if m is None:
                raise _invalid()
            pos = m.end()
        # A value ended: close containers, or go on to the next element or member.
        while True:
            if not stack:
                return pos
            pos = ws(text, pos).end()
            if pos >= n:
                raise _invalid()
            byte = text[pos]
            if byte == _COMMA:
                pos = ws(text, pos + 1).end()
                if len(stack) + 1 + RUN_DEPTH <= MAX_DEPTH:
                    start = pos
                    pos = (object_run if stack[-1] == _LBRACE else array_run)(text, pos, min(n, pos + RUN_WINDOW)).end()
                    work += (pos - start) >> 5
                    pos = ws(text, pos).end()
                if stack[-1] == _LBRACE:
                    pos = yield from _key(text, pos)
                break
            if byte != stack[-1] + 2:  # ']' closes '[', '}' closes '{'
                raise _invalid()
            stack.pop()
            pos += 1
        work += 1
        if work >= STEP:
            work = 0
            yield


def _key(text: Text, pos: int) -> Generator[None, None, int]:
    """`"key" :` at pos; the position of the value after it."""
    n = len(text)
    if pos >= n or text[pos] != _QUOTE:
        raise _invalid()
    end = _STRING_BODY(text, pos + 1, min(n, pos + 1 + WINDOW)).end()
    if end < n and text[end] == _QUOTE:
        end += 1
    else:
        end = yield from _string_end(text, pos)
    pos = _WS(text, end).end()
    if pos >= n or text[pos] != _COLON:
        raise _invalid()
    return _WS(text, pos + 1).end()


def scan_model(body: Text) -> str:
    """`scan` run to the end without yielding."""
    generator = scan(body)
    while True:
        try:
            next(generator)
        except StopIteration as stop:
            return str(stop.value)


def select_model(body: Text) -> str:
    """find_model without the event loop (tests, fuzzing)."""
    return loads_model(body) if small_enough_for_json(body) else scan_model(body)


async def find_model(body: Text, scanning: asyncio.Lock) -> str:
    """The model of `body`, letting the event loop run between pieces of a large scan. Large scans
    run one at a time: taking turns, N of them would delay every other request N steps."""
    if small_enough_for_json(body):
        return loads_model(body)
    async with scanning:
        generator = scan(body)
        while True:
            try:
                next(generator)
            except StopIteration as stop:
                return str(stop.value)
            await asyncio.sleep(0)
