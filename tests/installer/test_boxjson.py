"""The box JSON is checked by hand before anything acts on it; every problem names its field."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from fleetllm_installer.boxjson import BoxJsonError, parse_box, parse_text
from tests.installer.conftest import BOX


def problems_of(document: Any, host: str | None = BOX) -> list[str]:
    with pytest.raises(BoxJsonError) as caught:
        parse_box(document, host)
    return caught.value.problems


def test_rendered_json_parses(box_json: dict[str, Any]) -> None:
    box = parse_box(box_json, BOX)
    assert box.host == BOX
    assert box.revision == box_json["revision"]
    assert [s.name for s in box.servers] == ["large", "small"]  # name order
    small = next(s for s in box.servers if s.name == "small")
    assert small.args == ("--enable-prefix-caching", "--limit-mm-per-prompt", '{"image": 4}')
    assert small.vram_gb == 10
    assert small.digest.startswith("sha256:")


def test_llmao_shape_without_revision_or_served_name() -> None:
    box = parse_box({"host": "h", "servers": [{"name": "m", "model": "org/m", "host": "h", "port": 8001,
                                               "api_key": "sk-vllm-abcdefgh", "args": "--dtype bfloat16"}]}, "h")
    assert box.revision == "unknown"
    assert box.servers[0].served_model_name is None
    assert box.servers[0].args == ("--dtype", "bfloat16")


@pytest.mark.parametrize(("field", "value", "expected"), [
    ("name", "bad name", "servers[0].name"),
    ("name", None, "servers[0].name"),
    ("model", "", "servers[0].model"),
    ("port", "8001", "servers[0].port: expected an integer 1-65535, got \"8001\""),
    ("port", True, "servers[0].port"),
    ("port", 70000, "servers[0].port"),
    ("args", 5, "servers[0].args: expected a list"),
    ("args", ["ok", 3], "servers[0].args[1]"),
    ("args", ["--api-key", "x"], "servers[0].args[0]: --api-key is a flag fleetllm manages"),
    ("args", ["--port=9"], "servers[0].args[0]: --port is a flag fleetllm manages"),
    ("args", ["--api-ke=sk-secret"], "servers[0].args[0]: --api-ke would be read by vLLM as --api-key"),
    ("args", ["--dtype", "half", "--hos=0.0.0.0"], "servers[0].args[2]: --hos would be read by vLLM as --host"),
    ("gpu_memory_utilization", 1.5, "servers[0].gpu_memory_utilization"),
    ("max_model_len", 4.5, "servers[0].max_model_len"),
    ("vram_gb", -1, "servers[0].vram_gb"),
    ("served_model_name", "a b", "servers[0].served_model_name"),
])
def test_bad_server_field_is_named(box_json: dict[str, Any], field: str, value: Any, expected: str) -> None:
    document = copy.deepcopy(box_json)
    document["servers"][0][field] = value
    assert any(expected in p for p in problems_of(document))


def test_bad_bearer_is_refused_without_showing_it(box_json: dict[str, Any]) -> None:
    document = copy.deepcopy(box_json)
    document["servers"][0]["api_key"] = 'sk "quoted #secret'
    problems = problems_of(document)
    assert any("servers[0].api_key" in p for p in problems)
    assert "secret" not in json.dumps(problems)


def test_duplicate_names_and_ports(box_json: dict[str, Any]) -> None:
    document = copy.deepcopy(box_json)
    document["servers"].append(copy.deepcopy(document["servers"][0]))
    problems = problems_of(document)
    assert any("name" in p and "appears twice" in p for p in problems)
    assert any("port" in p and "appears twice" in p for p in problems)


def test_json_for_another_host_is_refused(box_json: dict[str, Any]) -> None:
    assert any("this box is 'other'" in p for p in problems_of(box_json, "other"))


@pytest.mark.parametrize("document", [[], "x", {"servers": []}, {"host": "h", "servers": {}}])
def test_wrong_top_level_shape(document: Any) -> None:
    assert problems_of(document, None)


def test_error_document_is_reported() -> None:
    assert "answered an error" in problems_of({"error": "unknown host"})[0]


def test_not_json_names_the_source() -> None:
    with pytest.raises(BoxJsonError, match=r"box.json is not JSON: .* line 1 column 2"):
        parse_text("{nope", source="box.json")


def test_empty_server_list_is_a_valid_drain() -> None:
    assert parse_box({"host": "h", "servers": []}, "h").servers == ()
