"""Repository faults against the real control plane process (`fleetllm serve`): a commit that fails
validation, a YAML bomb, a huge file, a corrupt git object, a remote that goes away, force-pushes.

Every time the server keeps answering boxes from the last valid revision, and says why: in /health
(`last_attempted`, `last_refresh`), in /metrics, and in its log, once per bad commit however often it
refreshes. The in-process versions of some of these are tests/server/test_revisions.py; here the real
process, its background refresh loop (every second) and its webhook are under test.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.conftest import git
from tests.installer.realprocs import wait_until
from tests.support.plane import ControlPlane

from .conftest import box_headers, metric, plane_document, push_hook
from .test_git_objects import corrupt_loose_object

BOMB = "\n".join(["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
                 + [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]) + "\n"


def commit(repo: Path, name: str, text: str | Path, message: str) -> str:
    """Commit `text` as the file `name`, or a symbolic link to `text` when it is a Path."""
    (repo / name).unlink(missing_ok=True)
    if isinstance(text, Path):
        (repo / name).symlink_to(text)
    else:
        (repo / name).write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", message)
    return git(repo, "rev-parse", "HEAD")


def add_box(repo: Path, box: str) -> str:
    text = (repo / "placement.yaml").read_text() + f"\n  {box}:\n    - [qwen3-8b, 8001]\n"
    return commit(repo, "placement.yaml", text, f"add {box}")


def served(plane: ControlPlane) -> tuple[int, str | None]:
    """What a known box gets now: status and X-Fleet-Revision."""
    status, headers, _ = plane.get("/vllm/config", box_headers())
    return status, headers.get("X-Fleet-Revision")


def health(plane: ControlPlane) -> dict[str, Any]:
    status, body = plane.json("/health")
    assert status == 200, body
    return dict(body)


def metrics(plane: ControlPlane) -> str:
    return plane.get("/metrics")[2].decode()


def settle_logs(plane: ControlPlane, refreshes: float = 2.5) -> None:
    """Let the background loop (every ~1 s) refresh a few more times and the log buffer flush."""
    time.sleep(refreshes)


def refresh_errors_at_least(plane: ControlPlane, count: int) -> float:
    """fleetllm_git_refresh_errors_total once it has reached `count` (60 s at most)."""
    def reached() -> float | None:
        errors = metric(metrics(plane), "fleetllm_git_refresh_errors_total")
        return errors if errors >= count else None

    return float(wait_until(f"{count} failed git refreshes counted", reached, 60))


def test_bad_commits_keep_the_last_valid_revision_and_are_told_once(fleet_git: Path, tmp_path: Path,
                                                                    start_plane: Callable[..., ControlPlane],
                                                                    figures: Callable[..., None]) -> None:
    plane = start_plane(plane_document(tmp_path / "state", repo_path=fleet_git, refresh_interval_s=1))
    good = git(fleet_git, "rev-parse", "HEAD")
    assert served(plane) == (200, good)
    placement = (fleet_git / "placement.yaml").read_text()
    models = (fleet_git / "models.yaml").read_text()
    secret = tmp_path / "secret.yaml"
    secret.write_text("hosts: secret-on-the-server-Wd93\n")
    cases = {
        "invalid": ("placement.yaml", placement + "\n  203.0.113.98:\n    - [no-such-model, 8001]\n",
                    "unknown model 'no-such-model'"),
        "yaml-bomb": ("placement.yaml", BOMB, "yaml-too-large"),
        "huge-file": ("models.yaml", "# padding\n" * (1_700_000 + 1), "the limit is 16,777,216"),
        # issue 16, finding 9: a ValueError in the loader was filed as a git refresh error
        "huge-integer": ("models.yaml", models.replace("max_model_len: 40960", "max_model_len: " + "9" * 5000, 1),
                         "an integer of 5,000 digits"),
        # issue 16, finding 4: a committed symbolic link is refused, its target never read
        "symlink": ("placement.yaml", secret, "a symbolic link, not a regular file"),
    }
    rows = []
    for number, (case, (name, text, why)) in enumerate(cases.items(), start=1):
        git(fleet_git, "checkout", "-q", good, "--", ".")
        bad = commit(fleet_git, name, text, f"bad: {case}")
        before = plane.memory()
        status, answer = push_hook(plane)
        assert status == 200, answer
        assert answer["revision"] == good and answer["changed"] is False
        settle_logs(plane)
        assert served(plane) == (200, good), case
        body = health(plane)
        assert body["revision"] == good
        assert body["last_attempted"]["revision"] == bad and body["last_attempted"]["valid"] is False
        errors = " ".join(body["last_attempted"]["errors"])
        assert why in errors, (case, errors)
        assert "secret-on-the-server" not in errors and body["last_refresh"].get("error") is None, body
        text_metrics = metrics(plane)
        assert metric(text_metrics, "fleetllm_commit_validation_failures_total") == number
        assert metric(text_metrics, "fleetllm_last_attempted_revision_valid") == 0
        logged = [e for e in plane.log_events("invalid commit not served") if e["revision"] == bad]
        assert len(logged) == 1, (case, logged)
        after = plane.memory()
        rows.append({"case": case, "served": good[:12], "logged": len(logged),
                     "rss_before_mib": before.rss_mib, "rss_after_mib": after.rss_mib, "peak_mib": after.peak_mib})
    git(fleet_git, "checkout", "-q", good, "--", ".")
    fixed = add_box(fleet_git, "203.0.113.99")
    assert push_hook(plane)[1]["revision"] == fixed
    assert served(plane) == (200, fixed)
    assert metric(metrics(plane), "fleetllm_last_attempted_revision_valid") == 1
    figures(case="bad commits", rows=rows)


def test_a_corrupt_object_keeps_serving_and_a_new_commit_recovers(fleet_git: Path, tmp_path: Path,
                                                                   start_plane: Callable[..., ControlPlane],
                                                                   figures: Callable[..., None]) -> None:
    plane = start_plane(plane_document(tmp_path / "state", repo_path=fleet_git, refresh_interval_s=1))
    good = git(fleet_git, "rev-parse", "HEAD")
    bad = add_box(fleet_git, "203.0.113.97")
    blob = git(fleet_git, "rev-parse", f"{bad}:placement.yaml")
    corrupt_loose_object(fleet_git / ".git", blob)
    status, answer = push_hook(plane)
    assert status == 502 and "cannot read the git object" in answer["error"], answer
    # The webhook's refresh and the loop's (every ~1 s), each counted; on a loaded machine the loop's
    # can come later than a fixed pause, so the test waits for it.
    failures = refresh_errors_at_least(plane, 2)
    assert served(plane) == (200, good)
    body = health(plane)
    assert body["status"] == "ok" and body["revision"] == good
    assert "cannot read the git object" in body["last_refresh"]["error"]
    logged = plane.log_events("git refresh failed")
    assert len(logged) == 1, logged  # told once while the error stays the same
    # The fix is a new commit (the corrupt one stays in history): served at once, error cleared.
    (fleet_git / "placement.yaml").write_text(git(fleet_git, "show", f"{good}:placement.yaml") + "\n")
    git(fleet_git, "commit", "-qam", "rewrite placement")
    fixed = git(fleet_git, "rev-parse", "HEAD")
    status, answer = push_hook(plane)
    assert status == 200 and answer["revision"] == fixed, answer
    assert health(plane)["last_refresh"]["error"] is None
    assert served(plane) == (200, fixed)
    figures(case="corrupt object", refresh_errors=failures, logged=len(logged))


def test_remote_unreachable_corrupt_and_force_pushed(fleet_git: Path, tmp_path: Path,
                                                     start_plane: Callable[..., ControlPlane],
                                                     figures: Callable[..., None]) -> None:
    remote = tmp_path / "remote.git"
    git(tmp_path, "clone", "-q", "--bare", str(fleet_git), str(remote))
    git(fleet_git, "remote", "add", "origin", str(remote))
    plane = start_plane(plane_document(tmp_path / "state", repo_url=f"file://{remote}", refresh_interval_s=1))
    base = git(fleet_git, "rev-parse", "HEAD")
    assert served(plane) == (200, base)

    # 1. The remote goes away: keep serving, say why, recover when it is back.
    away = tmp_path / "away.git"
    remote.rename(away)
    status, answer = push_hook(plane)
    assert status == 502 and "git fetch" in answer["error"], answer
    unreachable_errors = refresh_errors_at_least(plane, 2)  # the webhook's refresh and the loop's
    assert served(plane) == (200, base)
    assert health(plane)["last_refresh"]["error"].startswith("git fetch")
    assert len(plane.log_events("git refresh failed")) == 1
    away.rename(remote)
    assert push_hook(plane)[0] == 200
    assert health(plane)["last_refresh"]["error"] is None

    # 2. A pushed commit whose object is corrupt on the remote: the fetch fails, nothing changes.
    added = add_box(fleet_git, "203.0.113.99")
    git(fleet_git, "push", "-q", "origin", "main")
    git(remote, "prune-packed")
    corrupt_loose_object(remote, git(fleet_git, "rev-parse", f"{added}:placement.yaml"))
    status, answer = push_hook(plane)
    assert status == 502, answer
    assert served(plane) == (200, base)
    shutil.rmtree(remote)  # repair: the remote is pushed afresh
    git(tmp_path, "clone", "-q", "--bare", str(fleet_git), str(remote))
    assert push_hook(plane)[1]["revision"] == added

    # 3. A force-push that drops that commit: the new history's head is served.
    git(fleet_git, "reset", "-q", "--hard", base)
    rewritten = add_box(fleet_git, "203.0.113.77")
    git(fleet_git, "push", "-q", "--force", "origin", "main")
    assert push_hook(plane)[1]["revision"] == rewritten
    status, _, _ = plane.get("/vllm/config", box_headers("203.0.113.99"))
    assert status == 404  # the dropped commit's box is gone with it
    assert plane.get("/vllm/config", box_headers("203.0.113.77"))[0] == 200

    # 4. A force-push onto an invalid head: its newest valid ancestor is served, never the old history.
    git(fleet_git, "reset", "-q", "--hard", base)
    bad = commit(fleet_git, "models.yaml", "models: {}\n", "empty catalogue")
    git(fleet_git, "push", "-q", "--force", "origin", "main")
    status, answer = push_hook(plane)
    assert status == 200 and answer["revision"] == base, answer
    body = health(plane)
    assert body["last_attempted"] == {**body["last_attempted"], "revision": bad, "valid": False}
    assert served(plane) == (200, base)
    figures(case="remote", unreachable_refresh_errors=unreachable_errors,
            distinct_errors_logged=len(plane.log_events("git refresh failed")),
            recoveries_logged=len(plane.log_events("git refresh recovered")))
