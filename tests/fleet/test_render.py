"""Box JSON rendering: the contract's shape, exactly."""

from __future__ import annotations

import json

import pytest

from fleetllm.adapters.git import read_directory
from fleetllm.core.fleet.bearer import Salt
from fleetllm.core.fleet.render import Bearers, RenderError, render_box
from fleetllm.core.fleet.validate import validate_snapshot
from tests.conftest import EXAMPLE, TEST_LEGACY_KEY, TEST_SALT
from tests.fleet.helpers import FLEET, MODELS, validate

BEARERS = Bearers(Salt(TEST_SALT), TEST_LEGACY_KEY)


def example_fleet():  # type: ignore[no-untyped-def]
    validation = validate_snapshot(read_directory(EXAMPLE))
    assert validation.fleet is not None
    return validation.fleet


def test_example_box_json_matches_the_contract() -> None:
    doc = render_box(example_fleet(), "203.0.113.10", BEARERS)
    assert list(doc) == ["host", "revision", "servers", "agent", "report_key"]  # rollout mode auto (the default)
    assert doc["agent"] == {"poll_s": 30}
    assert doc["host"] == "203.0.113.10" and doc["revision"] == "working-tree"
    first = doc["servers"][0]  # type: ignore[index]
    assert list(first) == ["name", "model", "served_model_name", "host", "port", "api_key", "args",
                           "max_model_len", "vram_gb", "disk_gb", "kv_bytes_per_token", "digest"]
    assert first["name"] == "qwen3-8b" and first["model"] == "Qwen/Qwen3-8B-FP8"
    assert first["port"] == 8001 and first["vram_gb"] == 9 and isinstance(first["vram_gb"], int)
    assert first["api_key"] == Salt(TEST_SALT).derive("203.0.113.10", 8001)
    assert first["args"] == ["--enable-auto-tool-choice", "--enable-prefix-caching", "--kv-cache-dtype", "fp8",
                             "--max-num-batched-tokens", "4096", "--reasoning-parser", "qwen3",
                             "--tool-call-parser", "hermes"]
    assert first["digest"].startswith("sha256:")
    second = doc["servers"][1]  # type: ignore[index]
    assert second["args"] == ["--enable-auto-tool-choice", "--tool-call-parser", "llama3_json"]  # string split


def test_optional_keys_only_when_the_recipe_sets_them() -> None:
    result = validate(models=MODELS.replace("vram_gb: 30, disk_gb: 40", "disk_gb: 40"))
    assert result.fleet is not None
    servers = render_box(result.fleet, "203.0.113.10", BEARERS)["servers"]
    assert "vram_gb" not in servers[1] and "max_model_len" not in servers[1]  # type: ignore[index,operator]
    assert "gpu_memory_utilization" not in servers[0]  # type: ignore[index,operator]


def test_third_element_names_the_process() -> None:
    doc = render_box(example_fleet(), "203.0.113.24", BEARERS)
    names = [s["name"] for s in doc["servers"]]  # type: ignore[index,union-attr,attr-defined]
    served = {s["served_model_name"] for s in doc["servers"]}  # type: ignore[index,union-attr,attr-defined]
    assert names == ["qwen3-8b", "qwen3-8b-b"] and served == {"qwen3-8b"}


def test_legacy_pair_uses_the_shared_key_and_needs_it() -> None:
    fleet = example_fleet()
    doc = render_box(fleet, "198.51.100.23", BEARERS)
    assert doc["servers"][0]["api_key"] == TEST_LEGACY_KEY  # type: ignore[index]
    with pytest.raises(RenderError, match=r"llama3.1-8b on 198.51.100.23:8000 is a legacy pair"):
        render_box(fleet, "198.51.100.23", Bearers(Salt(TEST_SALT)))


def test_unknown_host() -> None:
    with pytest.raises(RenderError, match=r"'10\.9\.9\.9' is not in the placement"):
        render_box(example_fleet(), "10.9.9.9", BEARERS)


def test_digest_follows_boot_fields_only() -> None:
    base = validate()
    changed_live = validate(models=MODELS + "    litellm:\n      model_info: {input_cost_per_token: 1.0e-07}\n")
    changed_boot = validate(models=MODELS.replace("max_model_len: 4096", "max_model_len: 8192"))
    digests = []
    for result in (base, changed_live, changed_boot):
        assert result.fleet is not None
        digests.append(render_box(result.fleet, "203.0.113.10", BEARERS)["servers"][0]["digest"])  # type: ignore[index]
    assert digests[0] == digests[1] != digests[2]


def test_salt_rotation_changes_the_digest_but_never_leaks_the_salt() -> None:
    result = validate(fleet=FLEET)
    assert result.fleet is not None
    one = render_box(result.fleet, "203.0.113.10", BEARERS)
    two = render_box(result.fleet, "203.0.113.10", Bearers(Salt("another-salt-value-0001")))
    assert one["servers"][0]["digest"] != two["servers"][0]["digest"]  # type: ignore[index]
    assert TEST_SALT not in json.dumps(one)


def test_a_manual_box_json_is_exactly_the_contract() -> None:
    result = validate(fleet=FLEET + "rollout:\n  mode: manual\n")
    assert result.fleet is not None and not result.errors
    assert list(render_box(result.fleet, "203.0.113.10", BEARERS)) == ["host", "revision", "servers", "report_key"]


def test_a_placement_override_decides_per_box_and_poll_s_is_rendered() -> None:
    placement = ("hosts:\n  203.0.113.10:\n    rollout: manual\n    servers:\n      - [m1, 8001]\n"
                 "  203.0.113.11:\n    - [m2, 8001]\n")
    result = validate(fleet=FLEET + "rollout:\n  poll_s: 45\n", placement=placement)
    assert result.fleet is not None and not result.errors, result.errors
    assert "agent" not in render_box(result.fleet, "203.0.113.10", BEARERS)
    others = [name for name in result.fleet.boxes if name != "203.0.113.10"]
    assert render_box(result.fleet, others[0], BEARERS)["agent"] == {"poll_s": 45}


def test_each_box_gets_its_own_report_key_from_the_salt() -> None:
    fleet = example_fleet()
    keys = {name: render_box(fleet, name, BEARERS)["report_key"] for name in fleet.boxes}
    assert len(set(keys.values())) == len(keys)  # one per box
    assert all(key == BEARERS.salt.report_key(name) for name, key in keys.items())
    assert all(isinstance(k, str) and k.startswith("rk-") and BEARERS.salt.derive(n, 8001) != k
               for n, k in keys.items())
