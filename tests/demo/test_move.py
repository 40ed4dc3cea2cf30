"""The move-model scenario's edit: which server moves where, as a two-line change of placement.yaml."""

from __future__ import annotations

import difflib

import pytest

from fleetllm.adapters.git import read_directory
from fleetllm.core.fleet.files import WORKTREE_REVISION, Snapshot
from fleetllm.core.fleet.validate import validate_snapshot
from fleetllm.demo.fleet import DemoError, simulate
from fleetllm.demo.move import Move, choose_move, move_row
from tests.conftest import EXAMPLE


def moved(files: dict[str, bytes], text: str) -> Snapshot:
    edited = {**files, "placement.yaml": text.encode()}
    return Snapshot(WORKTREE_REVISION, edited, {k: k for k in edited})


def test_the_example_moves_the_coder_model_to_the_a6000_box() -> None:
    demo = simulate(read_directory(EXAMPLE))
    move = choose_move(demo.fleet)
    assert move == Move("qwen2.5-coder-7b", "qwen2.5-coder-7b", "127.0.0.2", 8003, "127.0.0.3", 8003)
    before = demo.files["placement.yaml"].decode()
    after = move_row(before, move)
    changed = [line for line in difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0)
               if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    assert changed == ["-    - [qwen2.5-coder-7b, 8003]", "+      - [qwen2.5-coder-7b, 8003]"]
    validation = validate_snapshot(moved(dict(demo.files), after))
    assert validation.fleet is not None, validation.diagnostics
    boxes = validation.fleet.boxes
    assert [r.port for r in boxes["127.0.0.2"].servers] == [8001, 8002]
    assert [(r.model, r.port) for r in boxes["127.0.0.3"].servers][-1] == ("qwen2.5-coder-7b", 8003)


def test_a_named_row_keeps_its_name_and_the_target_comes_first_in_the_file() -> None:
    files = {p.name: p.read_bytes() for p in EXAMPLE.glob("*.yaml")}
    files["placement.yaml"] = (b"hosts:\n"
                               b"  box-a:\n    - [qwen3-8b, 8001]\n\n"
                               b"  box-b:\n    - [qwen3-8b, 8001]\n    - [qwen3-8b, 8002, qwen3-8b-b]\n")
    files["fleet.yaml"] = b"version: 1\n"
    validation = validate_snapshot(moved(files, files["placement.yaml"].decode()))
    assert validation.fleet is not None
    move = choose_move(validation.fleet)
    assert move == Move("qwen3-8b", "qwen3-8b-b", "box-b", 8002, "box-a", 8002)
    after = move_row(files["placement.yaml"].decode(), move)
    assert after == ("hosts:\n  box-a:\n    - [qwen3-8b, 8001]\n    - [qwen3-8b, 8002, qwen3-8b-b]\n\n"
                     "  box-b:\n    - [qwen3-8b, 8001]\n")


def test_nothing_to_move() -> None:
    files = {p.name: p.read_bytes() for p in EXAMPLE.glob("*.yaml")}
    files["placement.yaml"] = b"hosts:\n  box-a:\n    - [qwen3-8b, 8001]\n  box-b:\n    - [qwen3-8b, 8001]\n"
    files["fleet.yaml"] = b"version: 1\n"
    validation = validate_snapshot(moved(files, files["placement.yaml"].decode()))
    assert validation.fleet is not None
    with pytest.raises(DemoError, match="no server to move"):
        choose_move(validation.fleet)


def test_a_row_over_several_lines_is_refused_not_mangled() -> None:
    text = "hosts:\n  box-a:\n    - - qwen3-8b\n      - 8001\n    - [qwen3-8b, 8002, b]\n  box-b:\n    - [qwen3-8b, 8001]\n"
    with pytest.raises(DemoError, match="several lines"):
        move_row(text, Move("qwen3-8b", "qwen3-8b", "box-a", 8001, "box-b", 8002))
