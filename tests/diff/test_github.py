"""The GitHub side, run for real where it can be: the composite action's own step scripts against real
git repositories (a clone with an `origin`, as actions/checkout leaves it), its comment step against
a stand-in `gh` that keeps comments in a file, shellcheck on every step, the pre-commit hook through
pre-commit itself, and the schema references editors follow."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from fleetllm.cli.ghcomment import find, marker, payload
from tests.conftest import EXAMPLE, ROOT, git
from tests.diff.scenarios import SCENARIOS, apply, branch_with

BIN = Path(sys.executable).parent
ACTION = yaml.safe_load((ROOT / "action.yml").read_text())


def step(name: str) -> dict[str, Any]:
    found = [s for s in ACTION["runs"]["steps"] if s.get("name") == name]
    assert len(found) == 1, name
    return found[0]


def run_step(name: str, env: dict[str, str], cwd: Path, tmp: Path) -> tuple[subprocess.CompletedProcess[str],
                                                                           dict[str, str]]:
    """Run one `run:` step as GitHub does (bash -e -o pipefail), returning its $GITHUB_OUTPUT values."""
    script = step(name)["run"]
    assert "${{" not in script  # inputs reach scripts through env only (no injection)
    output, summary = tmp / "github_output", tmp / "step_summary"
    output.write_text("")
    full_env = {"PATH": f"{tmp / 'bin'}:{BIN}:/usr/bin:/bin", "HOME": str(tmp), "RUNNER_TEMP": str(tmp),
                "GITHUB_OUTPUT": str(output), "GITHUB_STEP_SUMMARY": str(summary),
                "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid",
                "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.invalid", **env}
    result = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script], cwd=cwd,
                            env=full_env, capture_output=True, text=True, timeout=120, check=False)
    values = dict(line.split("=", 1) for line in output.read_text().splitlines() if "=" in line)
    return result, values


@pytest.fixture
def checkout(fleet_git: Path, tmp_path: Path) -> Path:
    """A pull request's checkout: a clone of the fleet repository on branch `pr`, origin = the original."""
    branch_with(fleet_git, "pr", SCENARIOS["remove_box"])
    clone = tmp_path / "checkout"
    subprocess.run(["git", "clone", "-q", "--depth", "1", "--branch", "pr", f"file://{fleet_git}", str(clone)],
                   check=True)
    (tmp_path / "bin").mkdir()
    return clone


def test_validate_and_diff_steps_on_a_shallow_pull_request_checkout(checkout: Path, tmp_path: Path) -> None:
    result, out = run_step("Validate the fleet", {"FLEET_DIR": "."}, checkout, tmp_path)
    assert result.returncode == 0 and out == {"valid": "true", "code": "0"}
    result, out = run_step("Compare with the base branch", {"FLEET_DIR": ".", "BASE_INPUT": "", "PR_BASE": "main"},
                           checkout, tmp_path)
    assert result.returncode == 0, result.stderr
    assert out["changed"] == "true" and out["code"] == "2"
    report = Path(out["report"]).read_text()
    assert report.startswith("**fleetllm diff**") and "> **Outage:** model gemma3-27b" in report
    assert "1 model loses its last server." in result.stdout  # the whole text report is in the log
    assert (tmp_path / "step_summary").read_text() == report


def test_invalid_head_fails_the_check_but_still_reports(checkout: Path, tmp_path: Path) -> None:
    apply(checkout, [("placement.yaml", "[llama3.1-8b, 8002]", "[llama3.1-8b, 8009]")])
    git(checkout, "commit", "-q", "-am", "broken")
    result, out = run_step("Validate the fleet", {"FLEET_DIR": "."}, checkout, tmp_path)
    assert out == {"valid": "false", "code": "1"}
    assert "::error file=placement.yaml,line=10,col=21," in result.stdout
    _, out = run_step("Compare with the base branch", {"FLEET_DIR": ".", "BASE_INPUT": "origin/main", "PR_BASE": ""},
                      checkout, tmp_path)
    assert out["code"] == "1" and out["changed"] == ""
    assert "Cannot compare: HEAD" in Path(out["report"]).read_text()
    result, _ = run_step("Fail on an invalid fleet", {"VALIDATE": "1", "DIFF": "1"}, checkout, tmp_path)
    assert result.returncode == 1 and "::error::fleetllm: validate exited 1, diff exited 1" in result.stdout


FAKE_GH = """\
#!{python}
# A stand-in for `gh api` keeping the pull request's comments in $FAKE_GH_STATE (pages of 2).
import json, os, sys
state_file = os.environ["FAKE_GH_STATE"]
state = json.load(open(state_file))
args = sys.argv[1:]
assert args[0] == "api", args
if "--slurp" in args:
    comments = state["comments"]
    print(json.dumps([comments[i:i + 2] for i in range(0, len(comments), 2)] or [[]]))
    sys.exit(0)
method, path = args[args.index("--method") + 1], args[args.index("--method") + 2]
body = json.load(open(args[args.index("--input") + 1]))["body"]
state["calls"].append([method, path])
if os.environ.get("FAKE_GH_FAIL_WRITES"):
    sys.exit(1)
if method == "POST":
    state["comments"].append({{"id": 100 + len(state["comments"]), "body": body}})
else:
    comment_id = int(path.rsplit("/", 1)[1])
    next(c for c in state["comments"] if c["id"] == comment_id)["body"] = body
json.dump(state, open(state_file, "w"))
print("{{}}")
"""


def test_comment_step_creates_then_updates_one_comment(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    gh = bin_dir / "gh"
    gh.write_text(FAKE_GH.format(python=sys.executable))
    gh.chmod(0o755)
    state = tmp_path / "state.json"
    others = [{"id": 1, "body": "LGTM"}, {"id": 2, "body": "<!-- fleetllm-diff 0000 --> another fleet's"},
              {"id": 3, "body": "nice"}]
    state.write_text(json.dumps({"comments": others, "calls": []}))
    report = tmp_path / "report.md"
    env = {"FAKE_GH_STATE": str(state), "GH_TOKEN": "t", "GITHUB_REPOSITORY": "o/fleet", "PR_NUMBER": "7",
           "FLEET_DIR": ".", "REPORT": str(report)}

    report.write_text("first report\n")
    result, _ = run_step("Comment on the pull request", env, tmp_path, tmp_path)
    assert result.returncode == 0, result.stderr
    report.write_text("second report\n")
    result, _ = run_step("Comment on the pull request", env, tmp_path, tmp_path)
    assert result.returncode == 0, result.stderr

    final = json.loads(state.read_text())
    assert final["calls"] == [["POST", "repos/o/fleet/issues/7/comments"],
                              ["PATCH", "repos/o/fleet/issues/comments/103"]]
    assert final["comments"][:3] == others
    assert final["comments"][3] == {"id": 103, "body": f"{marker('.')}\nsecond report\n"}

    state.write_text(json.dumps({"comments": [], "calls": []}))
    result, _ = run_step("Comment on the pull request", {**env, "FAKE_GH_FAIL_WRITES": "1"}, tmp_path, tmp_path)
    assert result.returncode == 0 and "::warning::could not comment on the pull request" in result.stdout


def test_comment_bookkeeping() -> None:
    assert marker(".") == marker(".") != marker("fleet")
    assert re.fullmatch(r"<!-- fleetllm-diff [0-9a-f]{16} -->", marker("."))
    mark = marker(".")
    pages = [[{"id": 1, "body": "x"}, {"id": 2, "body": None}], [{"id": 3, "body": mark + "\nold"},
                                                                {"id": 4, "body": mark + "\nnewer"}]]
    assert find(pages, mark) == 3 and find(pages, marker("other")) is None and find({}, mark) is None
    assert payload(mark, "report\n") == {"body": f"{mark}\nreport\n"}


def test_every_action_step_passes_shellcheck(tmp_path: Path) -> None:
    for s in ACTION["runs"]["steps"]:
        if "run" in s:
            script = tmp_path / "step.sh"
            script.write_text("#!/usr/bin/env bash\n" + s["run"])
            result = subprocess.run([str(BIN / "shellcheck"), "--severity=info", str(script)], capture_output=True,
                                    text=True, check=False)
            assert result.returncode == 0, f"{s['name']}:\n{result.stdout}"


def test_workflows_pass_actionlint() -> None:
    workflows = sorted([*ROOT.glob(".github/workflows/*.yml"), *EXAMPLE.glob(".github/workflows/*.yml")])
    assert len(workflows) >= 4
    result = subprocess.run([str(BIN / "actionlint"), f"-shellcheck={BIN / 'shellcheck'}", *map(str, workflows)],
                            cwd=ROOT, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout


def test_pre_commit_manifest_is_valid() -> None:
    result = subprocess.run([str(BIN / "pre-commit"), "validate-manifest", str(ROOT / ".pre-commit-hooks.yaml")],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    hooks = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
    assert [h["id"] for h in hooks] == ["fleetllm-validate"]
    pattern = re.compile(hooks[0]["files"])
    assert all(pattern.search(p) for p in ("placement.yaml", "fleet/models.yaml", "fleet.yaml"))
    assert not any(pattern.search(p) for p in ("myfleet.yaml", "placement.yml", "README.md"))


@pytest.mark.slow
def test_pre_commit_hook_runs_fleetllm_validate(fleet_git: Path, tmp_path: Path) -> None:
    """pre-commit installs fleetllm from this repository's HEAD into its own environment and runs the hook."""
    env = {**os.environ, "PRE_COMMIT_HOME": str(tmp_path / "pre-commit-home")}

    def try_repo() -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(BIN / "pre-commit"), "try-repo", str(ROOT), "fleetllm-validate", "--all-files"],
                              cwd=fleet_git, env=env, capture_output=True, text=True, timeout=600, check=False)

    result = try_repo()
    assert result.returncode == 0 and re.search(r"fleetllm validate\.+Passed", result.stdout), result.stdout
    apply(fleet_git, [("placement.yaml", "[llama3.1-8b, 8002]", "[llama3.1-8b, 8009]")])
    result = try_repo()
    assert result.returncode == 1 and "port 8009 is not a listen port" in result.stdout


@pytest.mark.parametrize("name", ["fleet.yaml", "models.yaml", "placement.yaml"])
def test_example_files_reference_a_schema_that_validates_them(name: str) -> None:
    text = (EXAMPLE / name).read_text()
    first = text.splitlines()[0]
    match = re.fullmatch(r"# yaml-language-server: \$schema=(\S+)", first)
    assert match, first
    schema_path = (EXAMPLE / match[1]).resolve()
    assert schema_path.is_file() and schema_path.parent == ROOT / "schemas"
    schema = json.loads(schema_path.read_text())
    jsonschema.Draft202012Validator(schema).validate(yaml.safe_load(textwrap.dedent(text)))


def test_plan_step_attaches_its_result_or_its_failure(checkout: Path, tmp_path: Path) -> None:
    """With `plan: true` the plan step runs `fleetllm plan --against HEAD`; here LiteLLM is unreachable, so the
    plan fails and its message (not a secret, not a crash) is attached to the report the diff step writes."""
    env = {"FLEET_DIR": ".", "LITELLM_URL": "http://127.0.0.1:9", "LITELLM_MASTER_KEY": "sk-test-master",
           "FLEETLLM_VLLM_API_SALT": "test-salt-0123456789abcdef"}
    # The pull request adds a fleetllm.yaml: plan must not take it as its config (it would say where the
    # environment's credentials go); this one would fail on its unknown key if it were read.
    (checkout / "fleetllm.yaml").write_text("from_the_pull_request: {litellm: {master_key: ${env:LITELLM_MASTER_KEY}}}\n")
    result, out = run_step("Plan against the live fleet", env, checkout, tmp_path)
    assert result.returncode == 0, result.stderr
    attached = Path(out["file"]).read_text()
    assert attached.strip() and "sk-test-master" not in attached
    assert "fleetllm.yaml" not in attached and "from_the_pull_request" not in attached
    result, out = run_step("Compare with the base branch", {"FLEET_DIR": ".", "BASE_INPUT": "", "PR_BASE": "main",
                                                            "PLAN_FILE": str(tmp_path / "fleetllm-plan.json")},
                           checkout, tmp_path)
    assert result.returncode == 0, result.stderr
    report = Path(out["report"]).read_text()
    assert "Plan against the live fleet" in report and attached.splitlines()[0] in report
