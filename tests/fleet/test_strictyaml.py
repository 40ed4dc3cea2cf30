"""The strict YAML loader: YAML 1.2 scalars, duplicates, limits and positions."""

from __future__ import annotations

import pytest

from fleetllm.core.fleet import strictyaml
from fleetllm.core.fleet.strictyaml import Mark, load


def rules(text: str) -> list[str]:
    return [p.rule for p in load(text, "f.yaml").problems]


def test_plain_scalars_follow_yaml_1_2_core() -> None:
    doc = load("a: true\nb: False\nc: ~\nd: 12\ne: -3\nf: 1.5\ng: 1e3\nh: 2.32e-08\ni:\n", "f.yaml")
    assert doc.value == {"a": True, "b": False, "c": None, "d": 12, "e": -3, "f": 1.5, "g": 1000.0,
                         "h": 2.32e-08, "i": None}
    assert doc.problems == []


@pytest.mark.parametrize("text", ["yes", "no", "on", "Off", "NO", "y", "017", "0x1F", "0o17", "22:22", "1:30",
                                  "2024-01-02", "1_000", ".inf", ".nan", "017.5"])
def test_yaml_1_1_surprises_stay_strings(text: str) -> None:
    assert load(f"k: {text}\n", "f.yaml").value == {"k": text}


def test_quoted_and_tagged_scalars_are_strings() -> None:
    assert load("a: '1'\nb: \"true\"\nc: !!str 5\n", "f.yaml").value == {"a": "1", "b": "true", "c": "5"}


def test_duplicate_key_is_reported_with_both_lines() -> None:
    doc = load("hosts:\n  a: 1\n  b: 2\n  a: 3\n", "f.yaml")
    (problem,) = doc.problems
    assert problem.rule == "yaml-duplicate-key"
    assert problem.mark == Mark(4, 3)
    assert "first defined at line 2" in problem.message
    assert doc.value == {"hosts": {"a": 1, "b": 2}}


def test_non_string_keys_are_reported() -> None:
    doc = load("8001: x\ntrue: y\n~: z\n'8002': w\n", "f.yaml")
    assert [p.rule for p in doc.problems] == ["yaml-key-type"] * 3
    assert "quote it" in doc.problems[0].message
    assert doc.value == {"8002": "w"}


def test_merge_keys_and_custom_tags_are_refused() -> None:
    assert rules("base: &b {x: 1}\nm:\n  <<: *b\n") == ["yaml-merge-key"]
    assert rules("a: !!python/object:os.system x\n") == ["yaml-tag"]
    assert rules("a: !!set {x, y}\n") == ["yaml-tag"]


def test_anchors_and_aliases_share_structure() -> None:
    doc = load("a: &x [1, 2]\nb: *x\n", "f.yaml")
    assert doc.value == {"a": [1, 2], "b": [1, 2]}


def test_alias_bomb_is_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(strictyaml, "MAX_NODES", 10_000)
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 9):
        lines.append(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]")
    doc = load("\n".join(lines) + "\n", "bomb.yaml")
    assert doc.root is None
    assert [p.rule for p in doc.problems] == ["yaml-too-large"]


def test_billion_laughs_at_the_real_limit_fails_fast() -> None:
    lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for i in range(1, 10):
        lines.append(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]")
    doc = load("\n".join(lines) + "\n", "bomb.yaml")
    assert doc.root is None and doc.problems[-1].rule == "yaml-too-large"


def test_deep_nesting_is_stopped() -> None:
    doc = load("[" * 200 + "]" * 200, "deep.yaml")
    assert [p.rule for p in doc.problems] == ["yaml-too-deep"]


def test_oversized_input_is_refused_before_parsing() -> None:
    doc = load(b"a: 1\n" * (strictyaml.MAX_BYTES // 5 + 1), "huge.yaml")
    assert [p.rule for p in doc.problems] == ["yaml-too-large"]


def test_syntax_error_has_a_position() -> None:
    doc = load("a: [1, 2\nb: 3\n", "f.yaml")
    (problem,) = doc.problems
    assert problem.rule == "yaml-syntax" and problem.mark.line >= 2


def test_multiple_documents_and_bad_encoding() -> None:
    assert rules("a: 1\n---\nb: 2\n") == ["yaml-multiple-documents"]
    assert rules(b"a: \xff\xfe\n") == ["yaml-encoding"]  # type: ignore[arg-type]
    assert rules("a: \x07\n") == ["yaml-syntax"]


def test_undefined_alias() -> None:
    assert rules("a: *nope\n") == ["yaml-syntax"]


def test_positions_for_pointers() -> None:
    doc = load("hosts:\n  box:\n    - [m, 8001]\n    - [n, 8002, name]\n", "f.yaml")
    assert doc.mark_at(["hosts", "box", 1, 2]) == Mark(4, 17)
    assert doc.key_mark(["hosts"], "box") == Mark(2, 3)
    assert doc.raw_at(["hosts", "box", 0, 1]) == "8001"
    assert doc.mark_at(["hosts", "missing", 3]) == Mark(2, 3)


def test_empty_file() -> None:
    doc = load("# only a comment\n", "f.yaml")
    assert doc.empty and doc.problems == []


@pytest.mark.parametrize("text", ["version: 1\nlisten_ports:\n\t- 8001\n", "a:\n  b: 1\n\tc: 2\n"])
def test_a_tab_is_called_a_tab(text: str) -> None:
    # It used to say only "found character that cannot start any token".
    (problem,) = load(text, "f.yaml").problems
    assert problem.message.startswith("YAML syntax error: a tab character: YAML indents with spaces only; "
                                      "replace the tab with spaces")
    assert (problem.mark.line, problem.mark.column) == (3, 1)


def test_a_tab_in_a_fleet_file_names_file_and_line(fleet_dir, capsys) -> None:  # type: ignore[no-untyped-def]
    from fleetllm.cli.main import main

    placement = fleet_dir / "placement.yaml"
    lines = placement.read_text().splitlines()
    row = next(i for i, line in enumerate(lines) if line.startswith("    "))
    lines[row] = "\t" + lines[row].lstrip()
    placement.write_text("\n".join(lines) + "\n")
    assert main(["validate", str(fleet_dir)]) == 1
    out = capsys.readouterr()
    assert f"placement.yaml:{row + 1}:1" in out.out + out.err
    assert "a tab character" in out.out + out.err
