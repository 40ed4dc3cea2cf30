"""Fit check, placement on cards and the card-division formula (fleetllm_installer.fit's docstring)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleetllm_installer.boxjson import ServerSpec
from fleetllm_installer.fit import CEILING, check_fit, gpus_needed
from fleetllm_installer.hardware import Gpu


def gpu(index: int = 0, gb: float = 80, name: str = "A100") -> Gpu:
    mib = int(gb * 1024)
    return Gpu(index=index, uuid=f"GPU-{index}", name=name, memory_total_mib=mib, memory_free_mib=mib)


def server(name: str, vram: float | None = None, *, util: float | None = None, disk: float | None = None,
           args: tuple[str, ...] = (), kv: int | None = None, max_len: int | None = None) -> ServerSpec:
    return ServerSpec(name=name, model=f"org/{name}", served_model_name=name, port=8000 + len(name),
                      api_key="sk-vllm-testtest", args=args, gpu_memory_utilization=util, max_model_len=max_len,
                      vram_gb=vram, disk_gb=disk, kv_bytes_per_token=kv)


def test_equal_shares_of_what_is_left() -> None:
    # 80 GB card, 72 GB usable; weights 10 + 30 leave 32, 16 each: (10+16)/80 and (30+16)/80.
    fit = check_fit((server("a", 10), server("b", 30)), (gpu(),), disk_free_gb=100)
    assert fit.ok
    assert fit.placements["a"].gpu_memory_utilization == 0.325
    assert fit.placements["b"].gpu_memory_utilization == 0.575
    assert fit.vram_needed_gb == 40
    assert fit.vram_total_gb == 80


def test_shares_follow_kv_need_when_every_server_states_it() -> None:
    # KV for one full sequence: a 1000 x 1000, b 3000 x 1000 -> a gets 1/4 of the 32 GB left, b 3/4.
    fit = check_fit((server("a", 10, kv=1000, max_len=1000), server("b", 30, kv=3000, max_len=1000)),
                    (gpu(),), disk_free_gb=None)
    assert fit.placements["a"].gpu_memory_utilization == pytest.approx((10 + 8) / 80)
    assert fit.placements["b"].gpu_memory_utilization == pytest.approx((30 + 24) / 80)


def test_explicit_utilization_is_reserved_and_kept() -> None:
    fit = check_fit((server("a", 20, util=0.5), server("b", 10)), (gpu(),), disk_free_gb=None)
    assert fit.ok
    assert fit.placements["a"].gpu_memory_utilization == 0.5
    assert fit.placements["b"].gpu_memory_utilization == 0.4  # (10 + 72 - 40 - 10) / 80


def test_single_server_takes_the_ceiling() -> None:
    fit = check_fit((server("only", 9),), (gpu(gb=24),), disk_free_gb=None)
    assert fit.placements["only"].gpu_memory_utilization == CEILING


def test_shortfall_names_every_server_and_the_numbers() -> None:
    fit = check_fit((server("a", 30), server("b", 30), server("c", 30)), (gpu(),), disk_free_gb=None)
    assert not fit.ok
    (problem,) = fit.problems
    assert "GPU 0 (A100, 80.0 GB): needs 90.0 GB" in problem
    assert "a 30.0 GB, b 30.0 GB, c 30.0 GB" in problem
    assert "72.0 GB (90%)" in problem


def test_weights_larger_than_own_utilization() -> None:
    fit = check_fit((server("a", 50, util=0.5),), (gpu(),), disk_free_gb=None)
    assert any("a: 50.0 GB of weights per GPU do not fit in its own gpu_memory_utilization 0.5" in p
               for p in fit.problems)


def test_disk_counts_only_what_is_not_cached() -> None:
    servers = (server("a", 1, disk=50), server("b", 1, disk=30))
    assert check_fit(servers, (gpu(),), disk_free_gb=60, cached_gb={"a": 45}).ok
    fit = check_fit(servers, (gpu(),), disk_free_gb=60)
    assert fit.disk_needed_gb == 80
    assert fit.problems == ("disk: needs 80.0 GB more for weights [a 50.0 GB, b 30.0 GB] but 60.0 GB is free",)


def test_every_gpu_counts_not_only_gpu_0() -> None:
    # 2 x 24 GB: 15 + 15 + 5 fits only across both cards.
    servers = (server("a", 15), server("b", 15), server("c", 5))
    fit = check_fit(servers, (gpu(0, 24), gpu(1, 24)), disk_free_gb=None)
    assert fit.ok, fit.problems
    assert fit.placements["a"].gpus == (0,)
    assert fit.placements["b"].gpus == (1,)
    assert fit.placements["c"].gpus == (0,)
    assert fit.placements["c"].after == ("a",)  # shares GPU 0 with a, not with b
    assert fit.placements["b"].after == ()
    assert fit.vram_total_gb == 48


def test_multi_gpu_box_too_small_is_reported() -> None:
    fit = check_fit((server("a", 20), server("b", 20), server("c", 20)), (gpu(0, 24), gpu(1, 24)), None)
    assert not fit.ok
    assert any(p.startswith("GPU ") and "needs 40.0 GB" in p for p in fit.problems)


def test_tensor_parallel_server_spans_cards() -> None:
    big = server("big", 40, args=("--tensor-parallel-size", "2"))
    fit = check_fit((big,), (gpu(0, 24), gpu(1, 24)), disk_free_gb=None)
    assert fit.ok, fit.problems
    assert fit.placements["big"].gpus == (0, 1)
    assert fit.placements["big"].gpu_memory_utilization == CEILING


def test_tensor_parallel_larger_than_the_box() -> None:
    fit = check_fit((server("big", 10, args=("-tp", "4")),), (gpu(0, 80),), disk_free_gb=None)
    assert fit.problems == ("big needs 4 GPUs (parallel size in its args), this box has 1",)


@pytest.mark.parametrize(("args", "expected"), [
    ((), 1), (("--tensor-parallel-size", "2"), 2), (("--tensor-parallel-size=4",), 4), (("-tp", "2", "-pp", "2"), 4),
    (("--pipeline-parallel-size", "3"), 3), (("--tensor-parallel-size", "x"), 1), (("--tensor-parallel-size",), 1),
])
def test_gpus_needed(args: tuple[str, ...], expected: int) -> None:
    assert gpus_needed(args) == expected


def test_unknown_gpus_leave_utilization_to_vllm_and_order_everything() -> None:
    fit = check_fit((server("b", 10), server("a", 10, util=0.3)), None, disk_free_gb=None,
                    probe_problems=("nvidia-smi is not on PATH",))
    assert not fit.ok
    assert fit.placements["a"].gpu_memory_utilization == 0.3
    assert fit.placements["b"].gpu_memory_utilization is None
    assert fit.placements["b"].after == ("a",)


def test_no_room_left_for_a_weightless_server() -> None:
    fit = check_fit((server("a", None), server("b", None, util=0.9)), (gpu(),), disk_free_gb=None)
    assert any("a: no GPU memory is left" in p for p in fit.problems)


@given(st.lists(st.integers(min_value=0, max_value=40), min_size=1, max_size=4), st.sampled_from([24, 48, 80]))
def test_division_never_oversubscribes_and_covers_the_weights(weights: list[int], card_gb: int) -> None:
    servers = tuple(server(f"s{i}", w) for i, w in enumerate(weights))
    fit = check_fit(servers, (gpu(gb=card_gb),), disk_free_gb=None)
    utils = [fit.placements[s.name].gpu_memory_utilization or 0.0 for s in servers]
    if sum(weights) <= CEILING * card_gb:
        assert fit.ok
        assert sum(utils) <= CEILING + 1e-9
        for s, util in zip(servers, utils, strict=True):
            assert util * card_gb >= (s.vram_gb or 0) - 0.001 * card_gb  # weights fit, up to the rounding
    else:
        assert not fit.ok
