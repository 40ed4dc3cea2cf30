"""Properties over generated placements: validation accepts them and rendering is faithful."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from fleetllm.core.fleet.bearer import Salt
from fleetllm.core.fleet.render import Bearers, render_all
from tests.conftest import TEST_SALT
from tests.fleet.helpers import validate

MODELS = """\
models:
  a:
    vllm: {model: org/a, vram_gb: 1, max_model_len: 2048}
  b:
    vllm: {model: org/b, args: "--dtype half", settings: {enable-prefix-caching: true}}
  c:
    vllm: {model: org/c, gpu_memory_utilization: 0.3}
"""

box_names = st.one_of(st.ip_addresses(v=4).map(str), st.from_regex(r"[a-z0-9]{6,14}", fullmatch=True))
rows = st.lists(st.tuples(st.sampled_from("abc"), st.booleans()), min_size=1, max_size=3)
placements = st.dictionaries(box_names, rows, min_size=1, max_size=6)


def placement_yaml(placement: dict[str, list[tuple[str, bool]]]) -> str:
    lines = ["hosts:"]
    for box, servers in placement.items():
        lines.append(f"  '{box}':")
        for index, (model, named) in enumerate(servers):
            port = 8001 + index
            lines.append(f"    - [{model}, {port}, {model}-{index}]" if named else f"    - [{model}, {port}]")
    return "\n".join(lines) + "\n"


def _unique_names(servers: list[tuple[str, bool]]) -> bool:
    names = [f"{m}-{i}" if named else m for i, (m, named) in enumerate(servers)]
    return len(set(names)) == len(names)


@settings(max_examples=60, deadline=None)
@given(placements.filter(lambda p: all(_unique_names(s) for s in p.values())))
def test_any_valid_placement_renders_faithful_round_tripping_json(
        placement: dict[str, list[tuple[str, bool]]]) -> None:
    result = validate(models=MODELS, placement=placement_yaml(placement))
    assert result.fleet is not None, [d.text() for d in result.diagnostics]
    bearers = Bearers(Salt(TEST_SALT))
    rendered = render_all(result.fleet, bearers)
    assert rendered == render_all(result.fleet, bearers)  # deterministic
    assert json.loads(json.dumps(rendered)) == rendered  # plain JSON, round-trips
    for box, servers in placement.items():
        doc = rendered[box]
        assert doc["host"] == box
        for index, ((model, named), entry) in enumerate(zip(servers, doc["servers"], strict=True)):  # type: ignore[arg-type]
            assert entry["port"] == 8001 + index
            assert entry["name"] == (f"{model}-{index}" if named else model)
            assert entry["model"] == f"org/{model}"
            assert entry["api_key"] == Salt(TEST_SALT).derive(box, 8001 + index)
            assert ("max_model_len" in entry) == (model == "a")
            assert ("gpu_memory_utilization" in entry) == (model == "c")


@settings(max_examples=40, deadline=None)
@given(placements.filter(lambda p: any(not _unique_names(s) for s in p.values())))
def test_duplicate_process_names_are_always_caught(placement: dict[str, list[tuple[str, bool]]]) -> None:
    result = validate(models=MODELS, placement=placement_yaml(placement))
    assert not result.valid
    assert {d.rule for d in result.errors} == {"duplicate-name"}
