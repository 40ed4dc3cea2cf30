"""`fleetllm plan` resolves an operator's pin (`fleetllm pin`) the way the reconcile job does
(fleetllm.job.runner.PassRunner.pinned: the controls' pin, then follow_pin), and says so: a real git
repository with two valid commits, the real state store (SQLite, and PostgreSQL where it is there)
holding a pin of the older one, the CLI as a process. Without a state store, plan says it cannot know."""

from __future__ import annotations

from pathlib import Path

from fleetllm.adapters.state import open_store
from tests.conftest import git
from tests.reconcile.fakes import FakeLitellmHttp
from tests.reconcile.test_apply_confirm import BOX, apply, world  # noqa: F401  (world: the fixture)
from tests.reconcile.test_loop_real import commit, write_fleet
from tests.state.conftest import pg_database, pg_url, store_url  # noqa: F401  (fixtures: SQLite, PostgreSQL)

from .fakes import free_port
from .test_commands import ENV, config, fleetllm

ACTOR = "admin:sha256:1f2e3d4c"
REASON = "bad gemma weights in the newest commit"


def two_commits(repo: Path) -> tuple[str, str]:
    """The example fleet (the pinned revision), then a commit that leaves one box of it (the newest)."""
    pinned = git(repo, "rev-parse", "HEAD")
    (repo / "placement.yaml").write_text("hosts:\n  203.0.113.10:\n    - [qwen3-8b, 8001]\n")
    git(repo, "commit", "-qam", "one box")
    return pinned, git(repo, "rev-parse", "HEAD")


def test_plan_works_from_the_pinned_revision_and_says_who_pinned_it_and_why(fleet_git: Path, tmp_path: Path,
                                                                          store_url: str,  # noqa: F811
                                                                          ) -> None:
    state_url = store_url  # a fresh SQLite file, a fresh PostgreSQL schema (tests/state/conftest.py)
    pinned, newest = two_commits(fleet_git)
    store = open_store(state_url)
    try:
        store.pin(pinned, ACTOR, 1_764_000_000.0, REASON)
    finally:
        store.close()
    cfg = config(tmp_path, f"http://127.0.0.1:{free_port()}")
    result = fleetllm("plan", "--config", str(cfg), "--repo", str(fleet_git), "--state", state_url, env=ENV)
    out = result.stdout
    assert "Traceback" not in result.stderr
    assert f"revision {pinned[:12]}" in out and f"revision {newest[:12]}" not in out, out
    assert "203.0.113.24:8002" in out  # a server only the pinned revision has
    assert (f"The fleet is PINNED to {pinned} since 2025-11-24 16:00:00 UTC by {ACTOR}: {REASON}. This plan, like "
            f"the reconcile job, works from the pinned revision, not the working tree (what it reads without the "
            "pin), until `fleetllm unpin`.") in out
    assert out.index("PINNED") < out.index(f"revision {pinned[:12]}")  # read before the plan

    # --against REV is planned as asked, and the note says the job will not do it while pinned.
    against = fleetllm("plan", "--config", str(cfg), "--repo", str(fleet_git), "--state", state_url,
                       "--against", newest, env=ENV)
    assert f"revision {newest[:12]}" in against.stdout
    assert (f"This plan shows {newest[:12]} as asked (--against REV); the reconcile job works from the pinned "
            f"revision {pinned[:12]} until `fleetllm unpin`, whatever is merged.") in against.stdout

    # JSON on stdout stays one document; the note goes to stderr.
    as_json = fleetllm("plan", "--config", str(cfg), "--repo", str(fleet_git), "--state", state_url,
                       "--format", "json", env=ENV)
    assert as_json.stdout.lstrip().startswith("{") and "PINNED" not in as_json.stdout
    assert f"The fleet is PINNED to {pinned}" in as_json.stderr

    assert "SUSPENDED" not in out

    # Unpinned and suspended: the newest again, and the job will write none of it.
    store = open_store(state_url)
    try:
        assert store.unpin(ACTOR, 1_764_000_100.0)
        assert store.suspend(ACTOR, 1_764_000_200.0, "LiteLLM upgrade")
    finally:
        store.close()
    unpinned = fleetllm("plan", "--config", str(cfg), "--repo", str(fleet_git), "--state", state_url, env=ENV)
    assert "revision working-tree" in unpinned.stdout and "203.0.113.24:8002" not in unpinned.stdout
    assert "PINNED" not in unpinned.stdout + unpinned.stderr
    assert (f"The fleet is SUSPENDED since 2025-11-24 16:03:20 UTC by {ACTOR}: LiteLLM upgrade. The reconcile job "
            "and apply write none of this plan to LiteLLM until `fleetllm resume`.") in unpinned.stdout
    assert "Pin: unknown" not in unpinned.stdout


def test_plan_without_a_state_store_says_it_cannot_know_the_pin(fleet_git: Path, tmp_path: Path) -> None:
    cfg = config(tmp_path, f"http://127.0.0.1:{free_port()}")
    result = fleetllm("plan", "--config", str(cfg), "--repo", str(fleet_git), "--state", "memory:", env=ENV)
    assert ("Pin: unknown. No state store is configured (state.url in the config, or --state), so this plan cannot "
            "see an operator's pin (fleetllm pin) or suspension") in result.stdout
    assert "Traceback" not in result.stderr


def test_apply_on_a_terminal_shows_the_plan_of_the_pinned_revision(
        world: tuple[FakeLitellmHttp, Path, dict[str, str], str],  # noqa: F811  (the imported fixture)
        tmp_path: Path) -> None:
    """`apply` asks about the plan it will apply: the pinned revision's (it used to show the newest commit's,
    then refuse as stale, or apply another plan than the one shown)."""
    fake, config, env, ident = world
    repo = tmp_path / "fleet"
    pinned = git(repo, "rev-parse", "HEAD")
    port = int(ident.rsplit(":", 1)[1])
    write_fleet(repo, [port], {BOX: [("tiny-b", port)]})  # the newest commit: another model on that port
    commit(repo, "tiny-b instead")
    store = open_store(f"sqlite:///{tmp_path}/state.db")
    try:
        store.pin(pinned, ACTOR, 1_764_000_000.0, REASON)
    finally:
        store.close()
    code, out = apply(config, env, answer="yes")
    assert code == 0, out
    assert f"The fleet is PINNED to {pinned}" in out
    assert f"revision {pinned[:12]}" in out and f"+ deployment {ident}" in out
    assert out.index("PINNED") < out.index("Do you want to perform these actions?")
    assert list(fake.rows) == [ident] and fake.rows[ident]["model_name"] == "tiny-a"


def test_plan_of_the_tracked_branch_runs_on_its_newest_valid_commit_as_the_job_does(fleet_git: Path,
                                                                                   tmp_path: Path) -> None:
    """The branch head is not valid: the reconcile job runs on the last valid commit (PassRunner.read); plan
    used to stop at the head ("not valid: nothing is planned")."""
    valid = git(fleet_git, "rev-parse", "HEAD")
    (fleet_git / "fleet.yaml").write_text((fleet_git / "fleet.yaml").read_text() + "nonsense_key: 1\n")
    git(fleet_git, "commit", "-qam", "broken")
    head = git(fleet_git, "rev-parse", "HEAD")
    cfg = config(tmp_path, f"http://127.0.0.1:{free_port()}")
    cfg.write_text(cfg.read_text().replace(f"repo: {{path: '{tmp_path}'}}", f"repo: {{path: '{fleet_git}', "
                                                                          "branch: main}"))
    result = fleetllm("plan", "--config", str(cfg), env=ENV)
    assert "Traceback" not in result.stderr
    assert f"revision {valid[:12]}" in result.stdout, result.stdout + result.stderr
    assert (f"the branch head {head[:12]} is not valid (1 error(s), above); this pass runs on the last valid "
            f"commit {valid[:12]}") in result.stderr
    against = fleetllm("plan", "--config", str(cfg), "--against", head, env=ENV)  # asked for: refused
    assert against.returncode == 1 and "is not valid: nothing is planned" in against.stderr
