"""The rollout scenarios' edits: each a small change a person would make in a pull request, valid, and
doing what the scenario says."""

from __future__ import annotations

import difflib

from fleetllm.adapters.git import read_directory
from fleetllm.core.fleet.files import WORKTREE_REVISION, Snapshot
from fleetllm.core.fleet.validate import validate_snapshot
from fleetllm.demo.fleet import simulate
from fleetllm.demo.move import remove_box
from fleetllm.demo.rollouts import (
    bad_boot_change,
    choose_single_move,
    empty_box_change,
    most_replicated,
    recipe_change,
    retire_box_change,
    single_move_change,
    with_setting,
)
from tests.conftest import EXAMPLE


def _demo() -> tuple[dict[str, str], object]:
    demo = simulate(read_directory(EXAMPLE))
    return {k: v.decode() for k, v in demo.files.items()}, demo.fleet


def _changed(before: str, after: str) -> list[str]:
    return [line for line in difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0)
            if line[:1] in "+-" and not line.startswith(("+++", "---"))]


def _valid(files: dict[str, str]):  # type: ignore[no-untyped-def]
    encoded = {k: v.encode() for k, v in files.items()}
    result = validate_snapshot(Snapshot(WORKTREE_REVISION, encoded, {k: k for k in encoded}))
    assert result.fleet is not None, result.diagnostics
    return result.fleet


def test_the_bad_boot_change_is_one_settings_line_of_the_most_replicated_model() -> None:
    files, fleet = _demo()
    assert most_replicated(fleet) == "qwen3-8b"  # type: ignore[arg-type]
    change = bad_boot_change(fleet, files)  # type: ignore[arg-type]
    assert change.halts
    assert _changed(files["models.yaml"], change.files["models.yaml"]) == ["+        dtype: bogus"]
    edited = _valid({**files, **change.files})
    assert edited.recipes["qwen3-8b"].vllm.settings["dtype"] == "bogus"
    assert edited.recipes["llama3.1-8b"] == fleet.recipes["llama3.1-8b"]  # type: ignore[attr-defined]


def test_a_recipe_without_settings_gets_an_inline_mapping() -> None:
    files, _ = _demo()
    after = with_setting(files["models.yaml"], "llama3.1-8b", "dtype", "half")
    assert _changed(files["models.yaml"], after) == ["+      settings: {dtype: half}"]
    assert _valid({**files, "models.yaml": after}).recipes["llama3.1-8b"].vllm.settings["dtype"] == "half"


def test_the_single_replica_move_moves_a_model_that_has_one_server() -> None:
    files, fleet = _demo()
    move = choose_single_move(fleet)  # type: ignore[arg-type]
    servers = [(b.name, r.port) for b in fleet.boxes.values() for r in b.servers if r.model == move.model]  # type: ignore[attr-defined]
    assert servers == [(move.source, move.source_port)]
    change, _ = single_move_change(fleet, files)  # type: ignore[arg-type]
    edited = _valid({**files, **change.files})
    after = [(b.name, r.port) for b in edited.boxes.values() for r in b.servers if r.model == move.model]
    assert after == [(move.target, move.target_port)]


def test_retire_box_removes_a_box_whose_models_run_elsewhere_and_nothing_else() -> None:
    files, fleet = _demo()
    change, box = retire_box_change(fleet, files)  # type: ignore[arg-type]
    before = fleet.boxes[box]  # type: ignore[attr-defined]
    assert [r.model for r in before.servers] == ["qwen3-8b", "qwen3-8b"]
    removed = _changed(files["placement.yaml"], change.files["placement.yaml"])
    assert all(line.startswith("-") for line in removed) and f"-  {box}:" in removed
    edited = _valid({**files, **change.files})
    assert box not in edited.boxes
    assert {b: x.servers for b, x in edited.boxes.items()} == {
        b: x.servers for b, x in fleet.boxes.items() if b != box}  # type: ignore[attr-defined]


def test_empty_box_moves_every_server_of_a_box_away_and_removes_it() -> None:
    files, fleet = _demo()
    change, box, _ = empty_box_change(fleet, files)  # type: ignore[arg-type]
    edited = _valid({**files, **change.files})
    assert box not in edited.boxes
    count = sum(len(b.servers) for b in edited.boxes.values())
    assert count == sum(len(b.servers) for b in fleet.boxes.values())  # type: ignore[attr-defined]
    models = sorted(r.model for b in edited.boxes.values() for r in b.servers)
    assert models == sorted(r.model for b in fleet.boxes.values() for r in b.servers)  # type: ignore[attr-defined]


def test_remove_box_keeps_every_other_line() -> None:
    text = "hosts:\n  # a\n  one:\n    - [m, 8001]\n\n  # b\n  two:\n    servers:\n      - [m, 8001]\n\n  three: []\n"
    assert remove_box(text, "two") == "hosts:\n  # a\n  one:\n    - [m, 8001]\n\n  three: []\n"
    assert remove_box(text, "one") == "hosts:\n\n  # b\n  two:\n    servers:\n      - [m, 8001]\n\n  three: []\n"


def test_the_recipe_change_after_a_removal_restarts_a_model_that_keeps_a_server() -> None:
    files, fleet = _demo()
    change, _ = retire_box_change(fleet, files)  # type: ignore[arg-type]
    after = _valid({**files, **change.files})
    recipe = recipe_change(after, {**files, **change.files})
    assert _changed(files["models.yaml"], recipe.files["models.yaml"]) == ["+      settings: {max-num-seqs: 64}"]
    changed = _valid({**files, **change.files, **recipe.files})
    model = next(m for m in changed.recipes if changed.recipes[m] != after.recipes[m])
    assert sum(r.model == model for b in after.boxes.values() for r in b.servers) >= 2


def test_rent_box_declares_a_pool_and_places_its_box_by_label_in_one_commit_then_releases_it() -> None:
    from fleetllm.core.fleet.model import Provider
    from fleetllm.demo.rollouts import capacity_change, release_change

    files, fleet = _demo()
    change = capacity_change(fleet, files, gpu="NVIDIA H100 80GB HBM3", max_per_hour=3.0)  # type: ignore[arg-type]
    assert set(change.files) == {"fleet.yaml", "placement.yaml"}  # one commit: the pool and its box
    declared = _valid({**files, **change.files})
    capacity = declared.settings.capacity
    assert capacity is not None and capacity.max_fleet_per_hour == 6.0
    pool = capacity.pools["demo"]
    assert (pool.provider, pool.gpu, pool.count, pool.max_per_hour) == (Provider.RUNPOD, "NVIDIA H100 80GB HBM3", 1,
                                                                         3.0)
    box = declared.boxes["fleetllm-demo-1"]  # placed by its label: the name the rental presents itself under
    assert box.provider is Provider.RUNPOD and [(r.model, r.port) for r in box.servers] == [("qwen3-8b", 8001)]
    assert not [line for line in _changed(files["placement.yaml"], change.files["placement.yaml"])
                if line.startswith("-")]  # added only
    merged = {**files, **change.files}
    released = release_change(merged, "fleetllm-demo-1")
    after = _valid({**merged, **released.files})
    assert "fleetllm-demo-1" not in after.boxes and set(after.boxes) == set(fleet.boxes)  # type: ignore[attr-defined]
    assert after.settings.capacity is not None and after.settings.capacity.pools["demo"].count == 0
    assert _changed(merged["fleet.yaml"], released.files["fleet.yaml"]) == ["-      count: 1", "+      count: 0"]


def test_the_command_line_offers_every_scenario_the_demo_plays() -> None:
    from fleetllm.cli.demo import SCENARIOS as OFFERED
    from fleetllm.demo.scenario import SCENARIOS

    assert OFFERED == SCENARIOS and "rent-box" in SCENARIOS
