"""`fleetllm diff` as a command: revisions, the default base, invalid commits, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fleetllm.cli.main import main
from tests.conftest import git
from tests.diff.scenarios import SCENARIOS, apply, branch_with


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def pr(fleet_git: Path) -> Path:
    """A branch `pr` that removes a box, one commit ahead of main."""
    branch_with(fleet_git, "pr", SCENARIOS["remove_box"])
    return fleet_git


def test_exit_codes_default_and_detailed(pr: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "diff", "--repo", str(pr))[0] == 0
    assert run(capsys, "diff", "--repo", str(pr), "--detailed-exitcode")[0] == 2
    code, out, _ = run(capsys, "diff", "main", "main", "--repo", str(pr), "--detailed-exitcode")
    assert code == 0 and "No changes: nothing to do." in out


def test_default_base_is_the_merge_base_not_the_branch_tip(pr: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fork = git(pr, "rev-parse", "main")
    git(pr, "checkout", "-q", "main")  # main moves on after the PR branched off
    apply(pr, SCENARIOS["live_field"])
    git(pr, "commit", "-q", "-am", "main moves on")
    git(pr, "checkout", "-q", "pr")
    code, out, _ = run(capsys, "diff", "--repo", str(pr), "--format", "json")
    report = json.loads(out)
    assert code == 0 and report["base"]["revision"] == fork
    assert report["deployments"] == [d for d in report["deployments"] if d["action"] == "delete"]  # not main's edit
    # Given explicitly, BASE is taken as it is: main's own later change shows up (reversed).
    _, out, _ = run(capsys, "diff", "main", "pr", "--repo", str(pr), "--format", "json")
    assert {d["action"] for d in json.loads(out)["deployments"]} == {"delete", "update"}


def test_base_branch_prefers_origin_main(pr: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(pr), str(clone)], check=True)
    git(clone, "checkout", "-q", "pr")
    git(clone, "branch", "-q", "-f", "main", "pr")  # a stale local main must not be the base
    _, out, _ = run(capsys, "diff", "--repo", str(clone), "--format", "json")
    assert json.loads(out)["base"]["revision"] == git(clone, "rev-parse", "origin/main")
    code, out, _ = run(capsys, "diff", "--repo", str(clone), "--base-branch", "main", "--format", "json")
    assert code == 0 and json.loads(out)["changed"] is False


def test_unknown_base_branch_and_revision_exit_2(pr: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "diff", "--repo", str(pr), "--base-branch", "origin/release")
    assert code == 2 and "--base-branch origin/release: no such branch" in err
    assert "git fetch origin release" in err
    code, _, err = run(capsys, "diff", "nope", "--repo", str(pr))
    assert code == 2 and "nope: no such revision" in err
    # Terraform's convention under --detailed-exitcode: every error is 1, 2 means changes.
    assert run(capsys, "diff", "nope", "--repo", str(pr), "--detailed-exitcode")[0] == 1


def test_no_main_branch_asks_for_base(fleet_git: Path, capsys: pytest.CaptureFixture[str]) -> None:
    git(fleet_git, "branch", "-q", "-m", "main", "trunk")
    code, _, err = run(capsys, "diff", "--repo", str(fleet_git))
    assert code == 2 and "neither origin/main nor main exists" in err


def test_not_a_git_repository_exits_2(fleet_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "diff", "--repo", str(fleet_dir))
    assert code == 2 and "not inside a git repository" in err


def break_head(repo: Path) -> str:
    git(repo, "checkout", "-q", "-b", "broken", "main")
    apply(repo, [("placement.yaml", "[llama3.1-8b, 8002]", "[llama3.1-8b, 8009]")])
    git(repo, "commit", "-q", "-am", "broken")
    return git(repo, "rev-parse", "HEAD")


def test_invalid_head_reports_errors_and_exits_1(fleet_git: Path, capsys: pytest.CaptureFixture[str]) -> None:
    head = break_head(fleet_git)
    code, out, err = run(capsys, "diff", "--repo", str(fleet_git))
    assert code == 1 and out == ""
    assert f"Cannot compare: HEAD ({head[:12]}) has 1 error" in err
    assert "placement.yaml:10:21: /hosts/203.0.113.10/1/1: port 8009 is not a listen port" in err
    code, out, _ = run(capsys, "diff", "--repo", str(fleet_git), "--format", "json")
    data = json.loads(out)
    assert code == 1 and data["valid"] is False and data["base"]["valid"] is True
    assert data["head"]["diagnostics"][0]["rule"] == "port-not-listen"
    code, out, _ = run(capsys, "diff", "--repo", str(fleet_git), "--format", "markdown")
    assert code == 1 and out.startswith("**fleetllm diff**: Cannot compare: HEAD")
    assert "port-not-listen" in out and out.count("```") == 2
    assert run(capsys, "diff", "--repo", str(fleet_git), "--detailed-exitcode")[0] == 1


def test_invalid_base_is_reported_too(fleet_git: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken = break_head(fleet_git)
    code, _, err = run(capsys, "diff", broken, "main", "--repo", str(fleet_git))
    assert code == 1 and f"BASE ({broken[:12]}) has 1 error" in err


def test_fleet_in_a_subdirectory(tmp_path: Path, fleet_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    repo = tmp_path / "ops"
    (repo / "fleet").parent.mkdir(parents=True, exist_ok=True)
    fleet_dir.rename(repo / "fleet")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "init")
    git(repo, "checkout", "-q", "-b", "pr")
    apply(repo / "fleet", SCENARIOS["boot_field"])
    git(repo, "commit", "-q", "-am", "boot")
    code, out, _ = run(capsys, "diff", "--repo", str(repo / "fleet"))
    assert code == 0 and out.splitlines()[1] == "2 boxes must restart vLLM."


def test_salt_is_never_needed_nor_bearers_printed(pr: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """The command runs without any secret, and a salt in the environment changes nothing it prints."""
    monkeypatch.delenv("FLEETLLM_VLLM_API_SALT", raising=False)
    monkeypatch.delenv("FLEETLLM_LEGACY_API_KEY", raising=False)
    git(pr, "checkout", "-q", "-b", "pr2", "main")
    apply(pr, SCENARIOS["swap_ports"])
    git(pr, "commit", "-q", "-am", "swap")
    outputs = []
    for fmt in ("text", "markdown", "json"):
        code, out, _ = run(capsys, "diff", "--repo", str(pr), "--format", fmt)
        assert code == 0 and "sk-" not in out
        outputs.append(out)
    monkeypatch.setenv("FLEETLLM_VLLM_API_SALT", "some-salt-0123456789abcdef")
    monkeypatch.setenv("FLEETLLM_LEGACY_API_KEY", "sk-legacy-xyz")
    assert [run(capsys, "diff", "--repo", str(pr), "--format", f)[1] for f in ("text", "markdown", "json")] == outputs


def test_console_script_help_documents_exit_codes() -> None:
    result = subprocess.run([sys.executable, "-m", "fleetllm", "diff", "--help"], capture_output=True, text=True,
                            check=True)
    assert "--detailed-exitcode" in result.stdout and "0  no changes   1  any error   2  changes" in result.stdout
    assert "origin/main if it exists, else main" in result.stdout


def test_the_pull_request_that_adds_the_fleet_shows_all_of_it_as_new(tmp_path: Path, fleet_dir: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    repo = tmp_path / "new-fleet"
    repo.mkdir()
    (repo / "README.md").write_text("fleet\n")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "empty repository")
    git(repo, "checkout", "-q", "-b", "add-fleet")
    for name in ("fleet.yaml", "models.yaml", "placement.yaml"):
        (repo / name).write_text((fleet_dir / name).read_text())
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "the fleet")
    code, out, _ = run(capsys, "diff", "--repo", str(repo), "--detailed-exitcode")
    assert code == 2
    assert out.splitlines()[1] == "4 new boxes to provision; LiteLLM: 7 to create."
    # Only a BASE with no fleet file at all counts as empty; a partial one is invalid as usual.
    git(repo, "checkout", "-q", "-b", "partial", "main")
    (repo / "fleet.yaml").write_text((fleet_dir / "fleet.yaml").read_text())
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "partial")
    code, _, err = run(capsys, "diff", "partial", "add-fleet", "--repo", str(repo))
    assert code == 1 and "BASE" in err and "missing: a fleet repository needs models.yaml" in err


def test_attach_plan_json_and_text(pr: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A plan saved by the planner (`plan --out`) rides along in every format; a text plan (or the error a
    failed `fleetllm plan` printed) is shown as it is."""
    from fleetllm.core.judge.plantext import render_json as render_plan_json
    from tests.reconcile.builders import failed, ok, server
    from tests.reconcile.test_plan import deployment_for, intended, plan_of

    a, b = server("127.0.0.2", 8001, "qwen"), server("127.0.0.3", 8001, "qwen")
    plan = plan_of([a, b], {a.key: ok(a), b.key: failed()}, [deployment_for(server("127.0.0.4", 8001))])
    saved = tmp_path / "plan.json"
    saved.write_text(render_plan_json(plan, intended([a, b])))
    code, out, _ = run(capsys, "diff", "--repo", str(pr), "--attach-plan", str(saved))
    assert code == 0
    assert "Plan against the live fleet" in out
    assert "+ create fleetllm:127.0.0.2:8001 qwen" in out and "- delete fleetllm:127.0.0.4:8001" in out
    assert "Plan: 1 to add, 0 to change, 1 to destroy." in out
    _, out, _ = run(capsys, "diff", "--repo", str(pr), "--attach-plan", str(saved), "--format", "json")
    assert json.loads(out)["plan"]["summary"] == {"add": 1, "change": 0, "destroy": 1}
    _, out, _ = run(capsys, "diff", "--repo", str(pr), "--attach-plan", str(saved), "--format", "markdown")
    assert "<summary>" in out and "Plan: 1 to add" in out and a.bearer not in out
    failed_plan = tmp_path / "plan.txt"
    failed_plan.write_text("fleetllm plan: LiteLLM at http://127.0.0.1:1 is unreachable\n")
    _, out, _ = run(capsys, "diff", "--repo", str(pr), "--attach-plan", str(failed_plan))
    assert "LiteLLM at http://127.0.0.1:1 is unreachable" in out
    code, _, err = run(capsys, "diff", "--repo", str(pr), "--attach-plan", str(tmp_path / "missing"))
    assert code == 2 and "cannot read it" in err
