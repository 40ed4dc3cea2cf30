"""fleetllm.core.fleet.build, directly: every field of a built recipe and box, the defaults a malformed
value falls back to (the builder is defensive: it keeps what it can and skips what a schema error
taints), and the row positions rules point at. Mutation testing (docs/testing.md) showed many of these
fields read but never asserted by the whole-fleet tests."""

from __future__ import annotations

from fleetllm.core.fleet.build import (
    Built,
    Finding,
    _row,
    build,
    build_boxes,
    build_recipe,
    build_recipes,
    build_rollout,
)
from fleetllm.core.fleet.files import FLEET_FILE, MODELS_FILE, PLACEMENT_FILE
from fleetllm.core.fleet.jsonvalue import JSON
from fleetllm.core.fleet.model import (
    Box,
    FleetSettings,
    LitellmRoute,
    Provider,
    Recipe,
    ReconcileMode,
    RolloutMode,
    RolloutSettings,
    ServerRow,
    VllmRecipe,
)

FULL_RECIPE: dict[str, JSON] = {
    "description": "a chat model",
    "reconcile": "paused",
    "health_grace_s": 600,
    "max_unavailable": 2,
    "vllm": {"model": "org/m", "served_model_name": "chat", "args": ["--dtype", "half", 7],
             "settings": {"enable-prefix-caching": True}, "max_model_len": 8192,
             "gpu_memory_utilization": 0.9, "vram_gb": 16, "disk_gb": 30.5, "kv_bytes_per_token": 131072},
    "litellm": {"params": {"rpm": 10}, "model_info": {"mode": "chat"}},
}


def empty() -> Built:
    return Built(settings=FleetSettings(), recipes={}, boxes={})


def test_every_recipe_field_is_read() -> None:
    findings: list[Finding] = []
    assert build_recipe("m", FULL_RECIPE, findings) == Recipe(
        name="m",
        vllm=VllmRecipe(model="org/m", served_model_name="chat", args=("--dtype", "half"),
                        settings={"enable-prefix-caching": True}, max_model_len=8192, gpu_memory_utilization=0.9,
                        vram_gb=16.0, disk_gb=30.5, kv_bytes_per_token=131072),
        litellm=LitellmRoute(params={"rpm": 10}, model_info={"mode": "chat"}),
        reconcile=ReconcileMode.PAUSED, health_grace_s=600, description="a chat model", max_unavailable=2)
    assert findings == []


def test_a_minimal_recipe_takes_every_default() -> None:
    assert build_recipe("m", {"vllm": {"model": "org/m"}}, []) == Recipe(
        name="m", vllm=VllmRecipe(model="org/m", served_model_name="m"), litellm=LitellmRoute(),
        reconcile=ReconcileMode.ACTIVE, health_grace_s=None, description=None, max_unavailable=None)


def test_malformed_recipe_values_fall_back_to_their_defaults() -> None:
    value: dict[str, JSON] = {
        "description": 3, "reconcile": "PAUSED", "health_grace_s": True, "max_unavailable": "2",
        "vllm": {"model": "org/m", "served_model_name": 5, "args": {"x": 1}, "settings": "--x",
                 "max_model_len": 1.5, "gpu_memory_utilization": "high", "vram_gb": "16", "disk_gb": None,
                 "kv_bytes_per_token": False},
        "litellm": {"params": ["rpm"], "model_info": "chat"},
    }
    assert build_recipe("m", value, []) == Recipe(
        name="m", vllm=VllmRecipe(model="org/m", served_model_name="m"), litellm=LitellmRoute())
    assert build_recipe("m", {"vllm": {"model": "org/m"}, "litellm": "x"}, []) == Recipe(
        name="m", vllm=VllmRecipe(model="org/m", served_model_name="m"))


def test_args_as_one_string_and_unsplittable_args() -> None:
    assert build_recipe("m", {"vllm": {"model": "o", "args": "--a 'b c'"}}, [])  \
        == Recipe(name="m", vllm=VllmRecipe(model="o", served_model_name="m", args=("--a", "b c")))
    findings: list[Finding] = []
    recipe = build_recipe("m", {"vllm": {"model": "o", "args": "--a 'b"}}, findings)
    assert recipe == Recipe(name="m", vllm=VllmRecipe(model="o", served_model_name="m"))
    assert findings == [Finding(MODELS_FILE, ("models", "m", "vllm", "args"), "args cannot be split shell-style: "
                                "No closing quotation; use a list of strings", "args-syntax")]


def test_a_recipe_without_a_model_is_not_built() -> None:
    assert build_recipe("m", {"vllm": {"args": []}}, []) is None
    assert build_recipe("m", {"vllm": "org/m"}, []) is None
    assert build_recipe("m", {"vllm": {"model": 1}}, []) is None


def test_recipes_a_schema_error_taints_are_broken() -> None:
    built = empty()
    models: JSON = {"models": {"m1": {"vllm": {"model": "o/1"}}, "m2": {"vllm": {"model": "o/2", "vram_gb": "x"}},
                               "m3": "junk", "m4": {"vllm": {}}}}
    build_recipes(models, {("models", "m2", "vllm", "vram_gb")}, built)
    assert list(built.recipes) == ["m1"] and built.broken_recipes == {"m2", "m3", "m4"}
    not_a_catalog: tuple[JSON, ...] = ([], "models", {"models": ["m1"]})
    for value in not_a_catalog:
        nothing = empty()
        build_recipes(value, set(), nothing)
        assert (nothing.recipes, nothing.broken_recipes) == ({}, set())


def test_every_box_field_is_read() -> None:
    built = empty()
    hosts: JSON = {"hosts": {
        "b1": {"provider": "vast", "gpu_memory_gb": 48, "gpus": 2, "disk_gb": 100.5, "notes": "rack 4",
               "reconcile": "paused", "gateway": 8001, "rollout": "manual",
               "servers": [["m1", 9001], ["m2", 9002, "second", 41234]]},
        "b2": [["m1", 8001]],
    }}
    build_boxes(hosts, set(), built)
    assert built.boxes == {
        "b1": Box(name="b1", servers=(ServerRow("m1", 9001, "m1"), ServerRow("m2", 9002, "second", 41234)),
                  provider=Provider.VAST, gpu_memory_gb=48.0, gpus=2, disk_gb=100.5, notes="rack 4",
                  reconcile=ReconcileMode.PAUSED, gateway_port=8001, rollout=RolloutMode.MANUAL),
        "b2": Box(name="b2", servers=(ServerRow("m1", 8001, "m1"),)),
    }
    assert built.row_paths == {("b1", 0): ("hosts", "b1", "servers", 0), ("b1", 1): ("hosts", "b1", "servers", 1),
                               ("b2", 0): ("hosts", "b2", 0)}


def test_malformed_box_values_fall_back_to_their_defaults() -> None:
    built = empty()
    build_boxes({"hosts": {"b": {"provider": "aws", "gpu_memory_gb": "48", "gpus": "two", "disk_gb": True,
                                 "notes": 4, "reconcile": "PAUSED", "gateway": 80.5, "rollout": "sometimes",
                                 "servers": []}}}, set(), built)
    assert built.boxes == {"b": Box(name="b", servers=())}


def test_rows_a_schema_error_taints_are_skipped_and_the_rest_keep_their_positions() -> None:
    built = empty()
    rows: JSON = [["m1", 8001, 5], "junk", ["m2", 8002], ["m3"], ["m3", 8003, "m3-b"]]
    build_boxes({"hosts": {"b": rows}}, {("hosts", "b", 0, 2)}, built)
    assert built.boxes["b"].servers == (ServerRow("m2", 8002, "m2"), ServerRow("m3", 8003, "m3-b"))
    assert built.row_paths == {("b", 0): ("hosts", "b", 2), ("b", 1): ("hosts", "b", 4)}


def test_a_malformed_box_is_skipped_and_the_others_are_built() -> None:
    built = empty()
    hosts: JSON = {"hosts": {"bad": {"servers": "m1"}, "tainted": {"servers": [["m1", 8001]]},
                             "good": {"servers": [["m1", 8001]], "gateway": "x"}}}
    build_boxes(hosts, {("hosts", "tainted", "servers")}, built)
    assert built.boxes == {"good": Box(name="good", servers=(ServerRow("m1", 8001, "m1"),))}
    not_a_placement: tuple[JSON, ...] = ([], "hosts", {"hosts": ["b"]})
    for value in not_a_placement:
        nothing = empty()
        build_boxes(value, set(), nothing)
        assert nothing.boxes == {}


def test_a_schema_error_in_a_box_field_skips_the_box() -> None:
    for field in ("gateway", "gpus", "servers"):
        built = empty()
        build_boxes({"hosts": {"b": {"gateway": 8001, "gpus": 1, "servers": [["m1", 9001]]}}},
                    {("hosts", "b", field)}, built)
        assert built.boxes == {} and built.row_paths == {}, field


def test_an_error_in_another_box_leaves_this_one_alone() -> None:
    built = empty()
    build_boxes({"hosts": {"a": {"servers": [["m1", 8001]]}, "b": [["m1", 8001]]}}, {("hosts", "c")}, built)
    assert list(built.boxes) == ["a", "b"]


def test_a_row() -> None:
    assert _row(["m1", 8001]) == ServerRow("m1", 8001, "m1")
    assert _row(["m1", 8001, "n", 41234]) == ServerRow("m1", 8001, "n", 41234)
    assert _row(["m1", 8001, 5, "41234"]) == ServerRow("m1", 8001, "m1")
    not_rows: tuple[JSON, ...] = (["m1"], [], "m1 8001", {"m1": 8001}, [1, 8001], ["m1", "8001"], ["m1", True],
                                  ["m1", 8001.0])
    for bad in not_rows:
        assert _row(bad) is None, bad


def test_rollout_settings_and_their_schema_errors() -> None:
    value: JSON = {"mode": "manual", "max_unavailable": 2, "poll_s": 60, "drain_s": 0, "other": 5}
    assert build_rollout(value, set()) == RolloutSettings(mode=RolloutMode.MANUAL, max_unavailable=2, poll_s=60,
                                                          drain_s=0)
    defaults = RolloutSettings()
    every: set[tuple[str | int, ...]] = {("rollout", "mode"), ("rollout", "max_unavailable"), ("rollout", "poll_s"), ("rollout", "drain_s")}
    assert build_rollout(value, every) == defaults
    assert build_rollout(value, {("rollout", "drain_s")}) == RolloutSettings(
        mode=RolloutMode.MANUAL, max_unavailable=2, poll_s=60, drain_s=defaults.drain_s)
    assert build_rollout({"mode": "fast", "max_unavailable": "2", "poll_s": True, "drain_s": None}, set()) == defaults
    assert build_rollout("manual", set()) == defaults


def test_build_reads_each_file_with_its_own_errors() -> None:
    settings: JSON = {"listen_ports": [9001, "x"]}
    models: JSON = {"models": {"m1": {"vllm": {"model": "o/1"}}, "m2": {"vllm": {"model": "o/2", "vram_gb": "x"}}}}
    placement: JSON = {"hosts": {"b": [["m1", 9001], ["m2", "x"]]}}
    built = build(settings, models, placement, {FLEET_FILE: {("listen_ports", 1)},
                                                MODELS_FILE: {("models", "m2", "vllm", "vram_gb")},
                                                PLACEMENT_FILE: {("hosts", "b", 1, 1)}})
    assert built.settings.listen_ports == FleetSettings().listen_ports
    assert list(built.recipes) == ["m1"] and built.broken_recipes == {"m2"}
    assert built.boxes == {"b": Box(name="b", servers=(ServerRow("m1", 9001, "m1"),))}
    clean = build(settings, models, placement, {})  # a file without errors may be left out of the mapping
    assert clean.settings.listen_ports == (9001,)
    assert list(clean.recipes) == ["m1", "m2"] and clean.recipes["m2"].vllm.vram_gb is None
    assert clean.boxes == built.boxes and clean.findings == []
