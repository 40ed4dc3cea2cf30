"""One broken repository per rule: each must fail with the right rule id, file and line."""

from __future__ import annotations

import pytest

from fleetllm.core.fleet.diagnostics import Severity
from fleetllm.core.fleet.rules import box_name_problem
from tests.fleet.helpers import FLEET, MODELS, PLACEMENT, only, validate


def test_the_baseline_is_valid() -> None:
    result = validate()
    assert result.valid, [d.text() for d in result.diagnostics]
    assert result.diagnostics == ()


def test_unknown_model() -> None:
    d = only(validate(placement=PLACEMENT + "    - [nope, 8003]\n"), "unknown-model")
    assert (d.file, d.line, d.column, d.pointer) == ("placement.yaml", 5, 8, "/hosts/203.0.113.10/2/0")


def test_port_outside_listen_ports() -> None:
    d = only(validate(placement=PLACEMENT.replace("8002]", "8004]")), "port-not-listen")
    assert (d.line, d.pointer) == (4, "/hosts/203.0.113.10/1/1")


def test_legacy_pair_may_use_another_port() -> None:
    fleet = FLEET + "legacy_servers:\n  - {host: 203.0.113.10, port: 8000}\n"
    result = validate(fleet=fleet, placement=PLACEMENT.replace("8002]", "8000]"))
    assert result.valid, [d.text() for d in result.diagnostics]


def test_unused_legacy_pair_is_a_warning() -> None:
    fleet = FLEET + "legacy_servers:\n  - {host: 198.51.100.1, port: 8000}\n"
    result = validate(fleet=fleet)
    d = only(result, "legacy-unused")
    assert d.severity is Severity.WARNING and result.valid


def test_too_many_servers() -> None:
    placement = PLACEMENT + "    - [m1, 8003, m1-b]\n"
    d = only(validate(fleet=FLEET + "max_servers_per_box: 2\n", placement=placement), "too-many-servers")
    assert (d.line, d.pointer) == (2, "/hosts/203.0.113.10")


def test_duplicate_port() -> None:
    d = only(validate(placement=PLACEMENT + "    - [m1, 8002, m1-b]\n"), "duplicate-port")
    assert (d.line, d.column) == (5, 12)
    assert "'m2'" in d.message


def test_duplicate_process_name() -> None:
    d = only(validate(placement=PLACEMENT + "    - [m1, 8003]\n"), "duplicate-name")
    assert (d.line, d.column) == (5, 8)


def test_unsafe_process_name() -> None:
    d = only(validate(placement=PLACEMENT + "    - [m1, 8003, 'bad name/x']\n"), "unsafe-name")
    assert (d.line, d.column) == (5, 18)


@pytest.mark.parametrize(("name", "fragment"), [
    ("999.1.1.1", "not a valid one"), ("::ffff:203.0.113.9", "203.0.113.9"), ("Box_A", "neither"),
    ("2001:DB8::1", "canonical"), ("-lead", "neither")])
def test_bad_box_names(name: str, fragment: str) -> None:
    d = only(validate(placement=f"hosts:\n  '{name}':\n    - [m1, 8001]\n"), "box-name")
    assert d.line == 2 and fragment in d.message


@pytest.mark.parametrize("name", ["203.0.113.10", "2001:db8::1", "k7v2m9x4q1w8e3", "gpu1.example.org", "127.0.0.2"])
def test_good_box_names(name: str) -> None:
    assert box_name_problem(name, None) is None


def test_vast_boxes_are_named_by_ip() -> None:
    placement = "hosts:\n  k7v2m9x4q1w8e3:\n    provider: vast\n    servers:\n      - [m1, 8001]\n"
    assert "Vast" in only(validate(placement=placement), "box-name").message


def test_vram_and_disk_above_declared_capacity() -> None:
    placement = ("hosts:\n  203.0.113.10:\n    gpu_memory_gb: 24\n    disk_gb: 50\n    servers:\n"
                 "      - [m1, 8001]\n      - [m2, 8002]\n")
    result = validate(placement=placement)
    vram = only(result, "vram-exceeds")
    assert vram.line == 3 and "40 GB" in vram.message and "m1 10 + m2 30" in vram.message
    assert only(result, "disk-exceeds").line == 4


def test_explicit_memory_fractions_above_one_card() -> None:
    models = MODELS.replace("vram_gb: 30,", "vram_gb: 30, gpu_memory_utilization: 0.6,").replace(
        "max_model_len: 4096,", "max_model_len: 4096, gpu_memory_utilization: 0.5,")
    assert only(validate(models=models), "gpu-memory-overcommit").line == 2


def test_context_window_beyond_max_model_len() -> None:
    models = MODELS + "    litellm:\n      model_info: {context_window: 8192}\n"
    models = models.replace("  m2:\n    vllm: {model: org/m2, vram_gb: 30, disk_gb: 40}\n", "") + \
        "  m2:\n    vllm: {model: org/m2, vram_gb: 30, disk_gb: 40}\n"
    d = only(validate(models=models), "max-model-len")
    assert d.file == "models.yaml" and d.pointer == "/models/m1/litellm/model_info/context_window"


def test_kv_cache_that_cannot_hold_one_sequence() -> None:
    models = MODELS.replace("max_model_len: 4096,", "max_model_len: 1000000, kv_bytes_per_token: 100000,")
    placement = "hosts:\n  203.0.113.10:\n    gpu_memory_gb: 48\n    servers:\n      - [m1, 8001]\n"
    d = only(validate(models=models, placement=placement), "max-model-len")
    assert "KV cache" in d.message and d.line == 3


@pytest.mark.parametrize("args", ["['--port', '9000']", "'--dtype half --api-key=x'", "['--served_model_name', 'x']"])
def test_managed_flag_in_args(args: str) -> None:
    models = MODELS.replace("{model: org/m2,", f"{{args: {args}, model: org/m2,")
    d = only(validate(models=models), "managed-flag")
    assert (d.line, d.pointer) == (5, "/models/m2/vllm/args")


def test_managed_flag_in_settings() -> None:
    models = MODELS.replace("{model: org/m2,", "{settings: {dtype: half, max-model-len: 8192}, model: org/m2,")
    d = only(validate(models=models), "managed-flag")
    assert d.pointer == "/models/m2/vllm/settings/max-model-len"


def test_managed_flag_smuggled_in_a_list_value() -> None:
    models = MODELS.replace("{model: org/m2,", "{settings: {lora-modules: [a, --port, '1']}, model: org/m2,")
    assert only(validate(models=models), "managed-flag").pointer.startswith("/models/m2/vllm/settings")


def test_control_character_in_an_argument() -> None:
    models = MODELS.replace("{model: org/m2,", '{args: ["--dtype", "a\\nb"], model: org/m2,')
    assert only(validate(models=models), "unsafe-arg").line == 5


def test_unsplittable_args_string() -> None:
    models = MODELS.replace("{model: org/m2,", "{args: \"--x 'unclosed\", model: org/m2,")
    assert only(validate(models=models), "args-syntax").line == 5


@pytest.mark.parametrize(("block", "key"), [("params: {api_base: 'http://x'}", "api_base"),
                                            ("model_info: {id: fixed}", "id"),
                                            ("model_info: {fleetllm_owner: me}", "fleetllm_owner")])
def test_reserved_route_fields(block: str, key: str) -> None:
    models = MODELS + f"    litellm:\n      {block}\n"
    assert only(validate(models=models), "reserved-route-field").pointer.endswith(f"/{key}")


def test_empty_placement_must_be_explicit() -> None:
    for placement in ("", "hosts: {}\n", "# nothing yet\n"):
        assert only(validate(placement=placement), "empty-placement").file == "placement.yaml"
        assert validate(placement=placement, fleet=FLEET + "allow_empty_placement: true\n").valid


def test_public_port_is_deprecated_but_valid() -> None:
    result = validate(placement=PLACEMENT.replace("[m2, 8002]", "[m2, 8002, null, 41234]"))
    d = only(result, "public-port-deprecated")
    assert result.valid and d.severity is Severity.WARNING and (d.line, d.column) == (4, 24)


def test_every_problem_is_reported_at_once() -> None:
    placement = PLACEMENT + "    - [nope, 8003]\n  'bad box':\n    - [m1, 8009]\n  203.0.113.11:\n    - [m1, eight]\n"
    result = validate(placement=placement, models=MODELS + "  m3:\n    vllm: {model: org/m3, vram_gb: many}\n")
    assert {d.rule for d in result.diagnostics} == {"unknown-model", "box-name", "port-not-listen", "schema-type"}
    assert not result.valid


def test_rows_for_a_malformed_recipe_are_not_called_unknown() -> None:
    models = MODELS.replace("vram_gb: 30,", "vram_gb: thirty,")
    result = validate(models=models)
    assert [d.rule for d in result.diagnostics] == ["schema-type"]


def test_two_servers_of_one_model_give_one_kv_message_and_no_negative_memory() -> None:
    """Issue 26: two servers of one model on a box gave the same message twice, with "-132 GB left"."""
    models = MODELS.replace("max_model_len: 4096,", "max_model_len: 1000000, kv_bytes_per_token: 100000,")
    two = "hosts:\n  203.0.113.10:\n    gpu_memory_gb: 48\n    servers:\n      - [m1, 8001]\n      - [m1, 8002, m1-b]\n"
    d = only(validate(models=models, placement=two), "max-model-len")
    assert "28 GB is left" in d.message  # 48 - 2 x 10
    over = two.replace("gpu_memory_gb: 48", "gpu_memory_gb: 8")  # the weights alone do not fit
    result = validate(models=models, placement=over)
    assert [x.rule for x in result.diagnostics if x.rule in ("max-model-len", "vram-exceeds")] == ["vram-exceeds"]
    assert not any("is left" in x.message for x in result.diagnostics)
