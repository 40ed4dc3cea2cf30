"""Approving a box: round-trip YAML edit, free ports, validation, a commit on a branch; CLI and admin API."""

from __future__ import annotations

import difflib
from collections.abc import Callable
from pathlib import Path

import pytest
from flask.testing import FlaskClient

from fleetllm.adapters.approve import approve, open_repo
from fleetllm.adapters.git import read_directory
from fleetllm.cli.main import main
from fleetllm.core.fleet.approve import ApproveError, Row, add_box, assign_rows, ref_name
from fleetllm.core.fleet.validate import validate_snapshot
from fleetllm.server.app import create_app
from fleetllm.server.runtime import Runtime
from tests.conftest import EXAMPLE, git
from tests.server.conftest import ADMIN_TOKEN, VIEWER_TOKEN, box_headers

HOST = "203.0.113.50"


def example_fleet():  # type: ignore[no-untyped-def]
    fleet = validate_snapshot(read_directory(EXAMPLE)).fleet
    assert fleet is not None
    return fleet


def added_lines(before: str, after: str) -> list[str]:
    diff = list(difflib.ndiff(before.splitlines(), after.splitlines()))
    assert not [line for line in diff if line.startswith("- ")], "an existing line changed"
    return [line[2:] for line in diff if line.startswith("+ ")]


def test_add_box_keeps_everything_else() -> None:
    before = (EXAMPLE / "placement.yaml").read_text()
    after = add_box(before, HOST, [Row("qwen3-8b", 8001, "qwen3-8b"), Row("qwen3-8b", 8002, "qwen3-8b-2")],
                    "Approved in a test")
    assert added_lines(before, after) == ["", "  # Approved in a test", f"  {HOST}:", "    - [qwen3-8b, 8001]",
                                          "    - [qwen3-8b, 8002, qwen3-8b-2]"]


def test_add_box_other_indentation() -> None:
    before = "# top comment\nhosts:\n    a.example:   # keep me\n    -   [m, 8001]\n"
    after = add_box(before, "b.example", [Row("m", 8001, "m")])
    assert after.startswith(before)
    assert "b.example:" in after


def test_add_box_refuses_to_reformat() -> None:
    with pytest.raises(ApproveError, match="without reformatting"):
        add_box("hosts:\n  a:\n   - [m, 8001]\n  b:\n     - [m, 8001]\n", "c", [Row("m", 8001, "m")])
    with pytest.raises(ApproveError, match="no `hosts:` mapping"):
        add_box("hosts: []\n", "c", [Row("m", 8001, "m")])


def test_assign_rows() -> None:
    fleet = example_fleet()
    rows = assign_rows(fleet, HOST, ["qwen3-8b", "gemma3-27b", "qwen3-8b"])
    assert rows == (Row("qwen3-8b", 8001, "qwen3-8b"), Row("gemma3-27b", 8002, "gemma3-27b"),
                    Row("qwen3-8b", 8003, "qwen3-8b-2"))
    with pytest.raises(ApproveError, match="unknown model nope; the catalog has"):
        assign_rows(fleet, HOST, ["nope"])
    with pytest.raises(ApproveError, match="already in the placement"):
        assign_rows(fleet, "203.0.113.10", ["qwen3-8b"])
    with pytest.raises(ApproveError, match="at most 3 servers"):
        assign_rows(fleet, HOST, ["qwen3-8b"] * 4)
    assert ref_name("2001:db8::1") == "approve/2001-db8--1"


def test_approve_commits_on_a_new_branch_without_touching_the_worktree(fleet_git: Path) -> None:
    head = git(fleet_git, "rev-parse", "HEAD")
    before = (fleet_git / "placement.yaml").read_text()
    done = approve(open_repo(fleet_git), HOST, ["qwen3-8b", "llama3.1-8b"], note="n")
    assert done.branch == f"approve/{HOST}"
    assert done.base == head
    assert git(fleet_git, "rev-parse", done.branch) == done.commit
    assert git(fleet_git, "rev-parse", "HEAD") == head
    assert git(fleet_git, "status", "--porcelain") == ""
    assert (fleet_git / "placement.yaml").read_text() == before
    assert git(fleet_git, "diff", "--name-only", head, done.commit) == "placement.yaml"
    committed = git(fleet_git, "show", f"{done.commit}:placement.yaml")
    assert added_lines(before.rstrip("\n"), committed)[-2:] == ["    - [qwen3-8b, 8001]", "    - [llama3.1-8b, 8002]"]
    assert "Approve box 203.0.113.50: qwen3-8b, llama3.1-8b" in git(fleet_git, "log", "-1", "--format=%B",
                                                                     done.commit)
    with pytest.raises(ApproveError, match="already exists"):
        approve(open_repo(fleet_git), HOST, ["qwen3-8b"])


def test_approve_validates_the_result(fleet_git: Path) -> None:
    # The edit is validated as a whole: a name no box can have fails the box-name rule, and nothing is committed.
    with pytest.raises(ApproveError, match="not valid"):
        approve(open_repo(fleet_git), "Not_A_Box", ["qwen3-8b"])
    assert "approve/" not in git(fleet_git, "branch", "--list")


def test_approve_onto_checked_out_branch_refused(fleet_git: Path) -> None:
    with pytest.raises(ApproveError, match="checked out"):
        approve(open_repo(fleet_git), HOST, ["qwen3-8b"], base_branch="main", onto_tracked=True)


def test_approve_onto_tracked_branch_of_bare_repo(tmp_path: Path, fleet_git: Path) -> None:
    bare = tmp_path / "fleet.git"
    git(tmp_path, "clone", "-q", "--bare", str(fleet_git), str(bare))
    base = git(bare, "rev-parse", "main")
    done = approve(open_repo(bare), HOST, ["qwen3-8b"], base_branch="main", onto_tracked=True)
    assert done.branch == "main"
    assert git(bare, "rev-parse", "main") == done.commit
    assert git(bare, "rev-parse", "main~1") == base


def test_cli_approve(fleet_git: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["approve", HOST, "qwen3-8b", "gemma3-27b", "--repo", str(fleet_git)]) == 0
    out = capsys.readouterr().out
    assert f"branch approve/{HOST}" in out
    assert "gemma3-27b (gemma3-27b) on listen port 8002" in out
    assert main(["approve", HOST, "nope", "--repo", str(fleet_git)]) == 1
    assert "unknown model nope" in capsys.readouterr().err


def test_admin_endpoints_need_tokens(client: FlaskClient) -> None:
    body = {"host": HOST, "models": ["qwen3-8b"]}
    assert client.post("/admin/approve", json=body).status_code == 401
    assert client.post("/admin/approve", json=body, headers={"Authorization": f"Bearer {VIEWER_TOKEN}"}
                       ).status_code == 403
    assert client.get("/admin/attention").status_code == 401
    for token in (VIEWER_TOKEN, ADMIN_TOKEN):
        for path in ("/admin/attention", "/admin/reports", "/admin/fetches", "/admin/approvals"):
            assert client.get(path, headers={"Authorization": f"Bearer {token}"}).status_code == 200, path
    bad = client.get("/admin/fetches?limit=0", headers={"Authorization": f"Bearer {VIEWER_TOKEN}"})
    assert bad.status_code == 400


def test_admin_approve_flow(client: FlaskClient, runtime: Runtime, fleet_git: Path) -> None:
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    client.get("/vllm/config", headers=box_headers(HOST), environ_base={"REMOTE_ADDR": "198.51.100.4"})
    attention = client.get("/admin/attention", headers=admin).get_json()["entries"]
    assert [(e["box"], e["peer"], e["count"]) for e in attention] == [(HOST, "198.51.100.4", 1)]
    assert client.post("/admin/approve", json={"host": HOST}, headers=admin).status_code == 400
    assert client.post("/admin/approve", json={"host": HOST, "models": ["nope"]}, headers=admin).status_code == 409
    response = client.post("/admin/approve", json={"host": HOST, "models": ["qwen3-8b"]}, headers=admin)
    assert response.status_code == 200
    done = response.get_json()
    assert done["branch"] == f"approve/{HOST}"
    assert done["servers"] == [{"model": "qwen3-8b", "port": 8001, "name": "qwen3-8b"}]
    assert git(fleet_git, "rev-parse", done["branch"]) == done["commit"]
    assert "198.51.100.4" in git(fleet_git, "show", f"{done['commit']}:placement.yaml")
    approvals = client.get("/admin/approvals", headers=admin).get_json()["approvals"]
    assert approvals[0]["host"] == HOST
    assert approvals[0]["actor"].startswith("admin:")
    assert ADMIN_TOKEN not in str(approvals)


def test_admin_approve_onto_tracked_branch_serves_it(tmp_path: Path, fleet_git: Path,
                                                      make_runtime: Callable[..., Runtime]) -> None:
    bare = tmp_path / "fleet.git"
    git(tmp_path, "clone", "-q", "--bare", str(fleet_git), str(bare))
    runtime = make_runtime(repo={"path": str(bare), "approve": {"target": "tracked"}})
    client = create_app(runtime).test_client()
    response = client.post("/admin/approve", json={"host": HOST, "models": ["qwen3-8b"]},
                           headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert response.status_code == 200
    assert runtime.tracker.served.revision == response.get_json()["commit"]  # type: ignore[union-attr]
    assert client.get("/vllm/config", headers=box_headers(HOST)).status_code == 200


def test_reports_view_tells_stale_boxes(client: FlaskClient) -> None:
    served = client.get("/vllm/config", headers=box_headers()).get_json()
    applied = [{"name": s["name"], "port": s["port"], "digest": s["digest"], "unit": f"vllm-{s['name']}",
                "state": "started"} for s in served["servers"]]
    report = {"revision": served["revision"], "installer_version": "0.1.0", "outcome": "installed",
              "servers": applied}
    assert client.post("/vllm/report", json=report, headers=box_headers()).status_code == 200
    viewer = {"Authorization": f"Bearer {VIEWER_TOKEN}"}
    view = client.get("/admin/reports", headers=viewer).get_json()["boxes"]["203.0.113.24"]
    assert view["staleness"] == {"stale": False, "revision_matches": True,
                                 "servers": {"qwen3-8b": "current", "qwen3-8b-b": "current"}}
    applied[1]["digest"] = "sha256:old"
    client.post("/vllm/report", json={**report, "servers": applied}, headers=box_headers())
    view = client.get("/admin/reports", headers=viewer).get_json()["boxes"]["203.0.113.24"]
    assert view["staleness"]["stale"] is True
    assert view["staleness"]["servers"]["qwen3-8b-b"] == "stale"


def test_approve_with_a_provider_writes_the_detailed_form(fleet_git: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A Vast or RunPod box must say so, or the reconciler would dial its listen ports (static)."""
    before = (fleet_git / "placement.yaml").read_text()
    assert main(["approve", HOST, "qwen3-8b", "--provider", "vast", "--repo", str(fleet_git)]) == 0
    commit = capsys.readouterr().out.split("commit ")[1].split()[0]
    committed = git(fleet_git, "show", f"{commit}:placement.yaml")
    assert added_lines(before.rstrip("\n"), committed)[-4:] == [
        f"  {HOST}:", "    provider: vast", "    servers:", "      - [qwen3-8b, 8001]"]
    assert "Approve box 203.0.113.50 (vast)" in git(fleet_git, "log", "-1", "--format=%B", commit)
    with pytest.raises(SystemExit):
        main(["approve", "203.0.113.51", "qwen3-8b", "--provider", "aws", "--repo", str(fleet_git)])


def test_admin_approve_with_a_provider(client: FlaskClient, fleet_git: Path) -> None:
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    bad = client.post("/admin/approve", json={"host": HOST, "models": ["qwen3-8b"], "provider": "aws"}, headers=admin)
    assert bad.status_code == 400 and "provider" in bad.get_json()["error"]
    done = client.post("/admin/approve", json={"host": HOST, "models": ["qwen3-8b"], "provider": "runpod"},
                       headers=admin).get_json()
    assert "provider: runpod" in git(fleet_git, "show", f"{done['commit']}:placement.yaml")
