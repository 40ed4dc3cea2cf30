"""`fleetllm diff` tells the truth about what it compares and what a change does (issue 26, item 5): an
uncommitted edit is never silently left out (a warning, a refusal instead of "No changes"), --worktree
compares it, every section gives one figure per model, and a make-before-break move is not called an
outage."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from fleetllm.cli.main import main
from tests.conftest import git
from tests.diff.scenarios import SCENARIOS, apply


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_an_uncommitted_edit_is_refused_not_called_no_changes(fleet_git: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    apply(fleet_git, SCENARIOS["move_model"])  # edited, not committed: the runbook's step 2 on a branch
    code, out, err = run(capsys, "diff", "--repo", str(fleet_git))
    assert code == 2 and "No changes" not in out
    assert "placement.yaml" in err and "uncommitted" in err and "--worktree" in err


def test_worktree_compares_the_edit(fleet_git: Path, capsys: pytest.CaptureFixture[str]) -> None:
    apply(fleet_git, SCENARIOS["move_model"])
    code, out, err = run(capsys, "diff", "--repo", str(fleet_git), "--worktree", "--format", "json")
    report = json.loads(out)
    assert code == 0 and err == "" and report["changed"] is True
    assert report["head"]["revision"] == "working-tree"
    assert {d["action"] for d in report["deployments"]} == {"create", "delete"}
    code, _, err = run(capsys, "diff", "main", "HEAD~0", "--repo", str(fleet_git), "--worktree")
    assert code == 2 and "give BASE only" in err


def test_a_commit_diff_beside_an_unrelated_edit_warns(fleet_git: Path, capsys: pytest.CaptureFixture[str]) -> None:
    git(fleet_git, "checkout", "-q", "-b", "pr")
    apply(fleet_git, SCENARIOS["move_model"])
    git(fleet_git, "commit", "-q", "-am", "move")
    apply(fleet_git, SCENARIOS["live_field"])  # a further edit, not committed
    code, out, err = run(capsys, "diff", "--repo", str(fleet_git))
    assert code == 0 and "qwen2.5-coder-7b" in out
    assert err.startswith("fleetllm diff: warning: models.yaml in ") and "uncommitted" in err
    code, _, err = run(capsys, "diff", "main", "pr", "--repo", str(fleet_git))  # revisions named: no warning
    assert code == 0 and err == ""


def test_the_move_gives_one_figure_per_model_and_no_false_outage(fleet_git: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    git(fleet_git, "checkout", "-q", "-b", "pr")
    apply(fleet_git, SCENARIOS["move_model"])
    git(fleet_git, "commit", "-q", "-am", "move")
    code, out, _ = run(capsys, "diff", "--repo", str(fleet_git))
    assert code == 0
    # The moved model starts on its new box before it stops on the old one: no outage warning for it.
    assert "may have no healthy server" not in out
    assert not re.search(r"qwen2\.5-coder-7b.*(NO server|no server)", out)
    # qwen3-8b: its box goes whole, 2 of its 3 servers at once; every section says it serves from 1 of 3.
    figures = set(re.findall(r"qwen3-8b serves from (\d+) of 3|it serves from (\d+) of 3", out))
    assert {a or b for a, b in figures} == {"1"}, out
    _, out, _ = run(capsys, "diff", "--repo", str(fleet_git), "--format", "json")
    restarts = {d["model"]: d for d in json.loads(out)["disruptions"]}
    assert restarts["qwen3-8b"]["out_at_once"] == 2


def test_a_manual_box_keeps_the_guess(fleet_git: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """With `rollout: manual` a person restarts the boxes, in any order: the warning stays."""
    git(fleet_git, "checkout", "-q", "-b", "pr")
    apply(fleet_git, SCENARIOS["move_model"])
    fleet = fleet_git / "fleet.yaml"
    text = fleet.read_text()
    assert "  mode: auto " in text
    fleet.write_text(text.replace("  mode: auto ", "  mode: manual "))
    git(fleet_git, "commit", "-q", "-am", "move, by hand")
    _, out, _ = run(capsys, "diff", "--repo", str(fleet_git))
    assert "qwen2.5-coder-7b may have no healthy server" in out
