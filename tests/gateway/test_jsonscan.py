"""fleetllm_gateway.jsonscan finds the body's `model` as json.loads (and LLMhop's Go decoder) would, without
building the document (issue 16, finding 6: a 99 MiB body of empty lists became 2.65 GB of lists and
held the event loop for 32 s)."""

from __future__ import annotations

import json
import tracemalloc
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from fleetllm_gateway import errors, jsonscan
from fleetllm_gateway.errors import BodyError
from fleetllm_gateway.jsonscan import (
    MAX_BRACKETS,
    MAX_DEPTH,
    WINDOW,
    loads_model,
    model_of_document,
    scan,
    scan_model,
    select_model,
    small_enough_for_json,
)

FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def answer(function: Any, body: bytes) -> str:
    """The model, or the error code."""
    try:
        return "model:" + function(body)
    except BodyError as exc:
        return exc.error.code
    except ValueError:
        return errors.INVALID_JSON.code


scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False, allow_infinity=False),
                    st.text(max_size=8))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(["model", "m", "messages", "Model", ""]) | st.text(
        max_size=4), inner, max_size=4)), max_leaves=20)
documents = st.one_of(values, st.dictionaries(st.sampled_from(["model", "messages", "x"]), values, max_size=4))
NOISE = [b"", b" ", b"\n", b"\t", b"\r", b",", b":", b"[", b"]", b"{", b"}", b'"', b"\\", b"\\u", b"\x00", b"\x1f",
         b"\xff", b"\xc3", b"NaN", b"null", b"-", b"0", b"1e", b".5", b"true", b'"model"', b"\xef\xbb\xbf"]


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    """A serialized document with a few bytes inserted, replaced or cut out."""
    text = json.dumps(draw(documents), ensure_ascii=draw(st.booleans()),
                      indent=draw(st.sampled_from([None, 1]))).encode()
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(0, len(text)))
        cut = draw(st.integers(0, 2))
        text = text[:at] + draw(st.sampled_from(NOISE)) + text[at + cut:]
    return text


@FUZZ
@given(st.one_of(documents.map(lambda d: json.dumps(d).encode()), mutated(), st.binary(max_size=60)))
@example(b'{"model": "m", "model": "n"}')
@example(b'{"model": "m", "model": null}')
@example(b'{"\\u006dodel": "esc\\u00e9\\ud800"}')
@example(b'{"model": "a\xffb"}')
@example(b'{"model": 1}')
@example(b'{"model": {"model": "x"}}')
@example(b'{"x": [1, 2, {"model": "nested"}], "model": "m"}')
@example(b' null ')
@example(b'null x')
@example(b'{}')
@example(b'{"model": "m"} x')
@example(b'{"model": "m",}')
@example(b'{"model": "m", "x": [01]}')
@example(b'{"model": "m", "x": NaN}')
@example(b'{"model": "m", "x": "\t"}')
@example(b'{"model": "m", "x": 1.}')
@example(b'\xef\xbb\xbf{"model": "m"}')
@example(b'{"model": "m", "x": ' + b"7" * 5000 + b"}")
def test_the_scanner_agrees_with_json_loads(body: bytes) -> None:
    assert answer(scan_model, body) == answer(loads_model, body) == answer(select_model, body) == \
        answer(decoded_model, body)


def decoded_model(body: bytes) -> str:
    """The oracle: JSONDecoder.decode itself (loads_model calls its scanner directly)."""
    text = body.decode("utf-8", "replace")
    if text.startswith("\ufeff"):
        raise ValueError("a byte order mark")
    return model_of_document(jsonscan._SMALL_DECODER.decode(text))


@pytest.mark.parametrize(("depth", "accepted"), [(MAX_DEPTH, True), (MAX_DEPTH + 1, False)])
def test_nesting_is_bounded_at_gos_limit(depth: int, accepted: bool) -> None:
    """The top-level object is level 1, as in Go's encoding/json (maxNestingDepth 10000)."""
    inner = depth - 1
    body = b'{"model": "m", "x": ' + b"[" * inner + b"]" * inner + b"}"
    assert answer(select_model, body) == ("model:m" if accepted else errors.INVALID_JSON.code)


def test_a_body_that_is_not_an_object_is_refused_without_reading_it() -> None:
    body = b"[" + b"[]," * 1_000_000 + b"[]]"
    generator = scan(body)
    with pytest.raises(BodyError) as caught:
        next(generator)
    assert caught.value.error is errors.INVALID_JSON


def run(body: bytes) -> tuple[str, int]:
    """The scanner's answer (model or error code) and how many times it yielded."""
    generator, steps = scan(body), 0
    while True:
        try:
            next(generator)
        except StopIteration as stop:
            return "model:" + str(stop.value), steps
        except BodyError as exc:
            return exc.error.code, steps
        steps += 1


LARGE = {  # bodies past the json.loads fast path, each crossing several windows
    "small containers": b'{"messages": [' + b"[[]],{}," * 60_000 + b'[]], "model": "m"}',
    "deep containers": b'{"model": "m", "x": [' + b"[[[[[[]]]]]]," * 6_000 + b"[]]}",
    "token ids": json.dumps({"prompt": list(range(200_000)), "model": "m"}).encode(),
    "token ids, compact": json.dumps({"prompt": list(range(200_000)), "model": "m"}, separators=(",", ":")).encode(),
    "chat": json.dumps({"model": "m", "messages": [{"role": "user", "content": "x\n\"y\"\\ " * 40}] * 3000}).encode(),
    "escapes": b'{"model":"m","x":"' + b"\\n\\u00e9\\\\\\\"" * 100_000 + b'"}',
    "one long string": b'{"x":"' + b"y" * (3 * WINDOW + 7) + b'", "model": "m"}',
    "long key": b'{"' + b"k" * (2 * WINDOW) + b'": [' + b"[1]," * 500 + b'[]], "model": "m"}',
    "model last, escaped": b'{"x": [' + b"{}," * 30_000 + b'{}], "m\\u006fdel": "\\u00e9"}',
}


@pytest.mark.parametrize("name", sorted(LARGE))
def test_large_bodies_agree_with_json_loads_and_are_scanned_in_steps(name: str) -> None:
    body = LARGE[name]
    assert not small_enough_for_json(body) or len(body) > 64 * 1024
    expected = answer(lambda b: model_of_document(json.loads(b.decode())), body)
    tracemalloc.start()
    try:
        got, steps = run(body)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert got == expected
    assert steps >= len(body) // (4 * WINDOW)  # the event loop runs between steps
    # one blanked copy and a run's regex state at most; json.loads would build the document (many times the body)
    assert peak < len(body) + 4 * 1024 * 1024


@pytest.mark.parametrize("cut", [1, 2, 3, 5, 100, 4097])
def test_large_bodies_cut_short_or_broken_are_invalid(cut: int) -> None:
    for body in LARGE.values():
        assert run(body[:-cut])[0] == errors.INVALID_JSON.code
    broken = LARGE["token ids"].replace(b", 150000,", b", 150000,,")
    assert run(broken)[0] == errors.INVALID_JSON.code
    bad_escape = LARGE["escapes"][:-2] + b'\\x"}'
    assert run(bad_escape)[0] == errors.INVALID_JSON.code


def test_more_brackets_than_the_cap_get_413_before_any_scanning() -> None:
    body = b'{"model": "m", "x": [' + b"[]," * MAX_BRACKETS + b"[]]}"
    assert run(body)[0] == errors.body_too_complex(MAX_BRACKETS).code
    assert errors.body_too_complex(MAX_BRACKETS).status == 413


@FUZZ
@given(st.one_of(documents.map(lambda d: json.dumps(d).encode()), mutated()), st.integers(1, 9), st.integers(1, 9))
@example(b'{"model": "m", "x": "a\\\\\\"b\\\\u00e9"}', 3, 2)
@example(b'{"model": "m", "x": [1, 2, 3, 4, 5]}', 4, 3)
def test_window_edges_change_nothing(body: bytes, window: int, run_window: int) -> None:
    """Windows of a few bytes put every token, escape and run across a window edge somewhere."""
    import fleetllm_gateway.jsonscan as jsonscan

    expected = answer(loads_model, body)
    saved = jsonscan.WINDOW, jsonscan.RUN_WINDOW
    jsonscan.WINDOW, jsonscan.RUN_WINDOW = window, run_window
    try:
        assert answer(scan_model, body) == expected
    finally:
        jsonscan.WINDOW, jsonscan.RUN_WINDOW = saved
