"""Schema patterns are anchored so that nothing the installer refuses can validate (issue 16, finding 5).

JSON Schema patterns are ECMA-262 regular expressions, which jsonschema runs with Python's `re.search`.
In Python `$` also matches before a final newline, so `model: "org/m\\n"` matched `^...$`, validated,
was served, and the installer refused every box of that model. Each pattern now ends `$(?![\\s\\S])`,
which means the same in both dialects: the end of the string and nothing after it.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import ROOT
from tests.fleet.helpers import MODELS, PLACEMENT, validate

END = r"$(?![\s\S])"


def patterns(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "pattern" and isinstance(value, str):
                yield value
            else:
                yield from patterns(value)
    elif isinstance(node, list):
        for item in node:
            yield from patterns(item)


SCHEMAS = sorted((ROOT / "schemas").glob("*.schema.json"))
ALL = sorted({(path.name, p) for path in SCHEMAS for p in patterns(json.loads(path.read_text()))})


def test_there_are_patterns_to_check() -> None:
    assert {name for name, _ in ALL} >= {"models.schema.json", "placement.schema.json", "control-plane.schema.json"}


@pytest.mark.parametrize(("schema", "pattern"), ALL)
def test_every_pattern_is_anchored_at_the_very_end(schema: str, pattern: str) -> None:
    assert pattern.startswith("^") and pattern.endswith(END), f"{schema}: {pattern}"
    assert pattern.count("$") == pattern.count(END) + pattern.count(r"\$"), f"{schema}: a bare $ in {pattern}"


SAMPLES = ["m1", "org/m", "Qwen/Qwen3-8B-FP8", "/models/a b", "/models/x", "/models/\u00e9", "/m/\x01",
           "127.0.0.1:8080", "[::1]:8080", "${env:X}", "${file:/run/x}", "http://h:1/x", "https://h",
           "sqlite:///state.db", "postgresql://u@h/db", "served:name/x", "a-b_c", ""]
SUFFIXES = ["", "\n", "\r\n", "\r", "\x00", "\u2028", "\x85", " "]


def node_results(cases: list[tuple[str, str]]) -> list[bool]:
    """RegExp(pattern).test(text) in node, ECMA-262's own engine, for each case."""
    script = ("const cases = JSON.parse(require('fs').readFileSync(0, 'utf8'));"
              "process.stdout.write(JSON.stringify(cases.map(([p, s]) => new RegExp(p).test(s) "
              "&& new RegExp(p, 'u').test(s))));")
    done = subprocess.run(["node", "-e", script], input=json.dumps(cases), capture_output=True, text=True,
                          check=True, timeout=60)
    results: list[bool] = json.loads(done.stdout)
    return results


def test_python_and_ecma_262_agree_and_refuse_what_follows_the_end() -> None:
    cases = [(pattern, sample + suffix) for _, pattern in ALL for sample in SAMPLES for suffix in SUFFIXES]
    in_node = node_results(cases)  # also proves each pattern compiles as ECMA-262, with and without `u`
    for (pattern, text), ecma in zip(cases, in_node, strict=True):
        python = re.search(pattern, text) is not None
        assert python == ecma, (pattern, text, python, ecma)
        if text.endswith(("\n", "\r", "\x00", "\u2028", "\x85")):
            assert not python, (pattern, text)


@settings(max_examples=50, deadline=None)
@given(st.data())
def test_whatever_a_pattern_takes_it_refuses_with_a_newline_after(data: st.DataObject) -> None:
    _, pattern = data.draw(st.sampled_from(ALL))
    text = data.draw(st.from_regex(pattern.removesuffix(END[1:]), fullmatch=True))
    assert re.search(pattern, text), (pattern, text)
    assert not re.search(pattern, text + "\n"), (pattern, text)


@pytest.mark.parametrize(("models", "placement", "pointer"), [
    (MODELS.replace("{model: org/m2,", '{model: "org/m2\\n",'), PLACEMENT, "/models/m2/vllm/model"),
    (MODELS.replace("{model: org/m2,", '{model: "/models/m2\\n",'), PLACEMENT, "/models/m2/vllm/model"),
    (MODELS.replace("{model: org/m2,", '{model: "/models/\\u00e9",'), PLACEMENT, "/models/m2/vllm/model"),
    (MODELS.replace("{model: org/m2,", '{model: "/models/a\\x01",'), PLACEMENT, "/models/m2/vllm/model"),
    (MODELS.replace("{model: org/m2,", '{served_model_name: "m2\\n", model: org/m2,'), PLACEMENT,
     "/models/m2/vllm/served_model_name"),
    (MODELS.replace("{model: org/m2,", '{settings: {"dtype\\n": half}, model: org/m2,'), PLACEMENT,
     "/models/m2/vllm/settings/dtype\n"),
    (MODELS.replace("  m2:", '  "m2\\n":'), PLACEMENT.replace("[m2, 8002]", '["m2\\n", 8002]'), "/models/m2\n"),
])
def test_a_trailing_newline_or_control_character_does_not_validate(models: str, placement: str,
                                                                   pointer: str) -> None:
    result = validate(models=models, placement=placement)
    assert not result.valid
    assert any(d.file == "models.yaml" and d.pointer == pointer and d.rule.startswith("schema-")
               for d in result.errors), [d.text() for d in result.errors]

