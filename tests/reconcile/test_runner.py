"""The pass runner (fleetllm.job.runner.PassRunner), the one every caller runs: `fleetllm plan`, `apply`,
`reconcile` (`--once` and its loop) and `fleetllm demo`. Real parts: a fleet git repository tracked at
its branch (the config's repo.path), the SQLite state store, its file lock, vLLM servers on loopback
addresses speaking vLLM's wire format (tests/reconcile/fakes.FakeVllm); LiteLLM's model API in memory
(the runner's LiteLLM seam, as the demo uses it).

What a caller gets, in the shipped order: the lock first (held: skipped, nothing read, nothing
written), then the operator controls (a suspension observes and records but writes nothing; a pin
makes the pass work from the pinned revision), the dry run (recorded, nothing written), the invalid
head (the pass runs on the last valid commit and says which head it passed over)."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from fleetllm.adapters.state import open_store
from fleetllm.adapters.state.locks import file_lock
from fleetllm.cli.main import main
from fleetllm.core.judge.adoption import AdoptSource
from fleetllm.errors import EXIT_INVALID, EXIT_USAGE, ConfigurationError
from fleetllm.job.configfile import load_config
from fleetllm.job.engine import PassOutcome
from fleetllm.job.runner import InvalidFleetError, PassRunner, RunnerOptions
from tests.conftest import TEST_SALT, git
from tests.pages.scenario import HEALTHY_BOX, Stubs, break_branch, make_repo
from tests.reconcile.fake_litellm import FakeLitellm

ENV = {"T_SALT": TEST_SALT, "T_MK": "sk-runner-master"}
ACTOR = "admin:sha256:0a1b2c3d"


class World:
    """A fleet repository on branch main, a config tracking it, the state file, the lock file."""

    def __init__(self, tmp_path: Path) -> None:
        self.repo = tmp_path / "fleet"
        self.stubs = Stubs(make_repo(self.repo))
        self.state = tmp_path / "state.sqlite3"
        self.lock = tmp_path / "pass.lock"
        self.metrics = tmp_path / "textfile" / "fleetllm.prom"
        self.metrics.parent.mkdir(parents=True)
        self.config_file = tmp_path / "control-plane.yaml"
        self.write_config()
        self.litellm = FakeLitellm()
        self.said: list[str] = []

    def write_config(self, extra: str = "") -> None:
        self.config_file.write_text(f"repo: {{path: '{self.repo}', branch: main}}\n"
                                    "secrets: {vllm_api_salt: '${env:T_SALT}'}\n"
                                    f"state: {{url: 'sqlite:///{self.state}'}}\n"
                                    "litellm: {url: 'http://127.0.0.1:9', master_key: '${env:T_MK}'}\n" + extra)

    def runner(self, **options: object) -> PassRunner:
        litellm = self.litellm
        chosen = RunnerOptions(**{"command": "reconcile", "lock_file": str(self.lock),
                                  "metrics_file": str(self.metrics), "litellm": lambda _session: litellm,
                                  **options})  # type: ignore[arg-type]
        return PassRunner(chosen, load_config(self.config_file, ENV), say=self.said.append)

    def scheduled(self, runner: PassRunner) -> PassOutcome | None:
        """One pass of the reconcile job's loop, the stub vLLM servers up meanwhile."""
        async def run() -> PassOutcome | None:
            async with self.stubs.running():
                return await runner.scheduled_pass()
        return asyncio.run(run())

    def control(self, act: str, *args: object) -> None:
        store = open_store(f"sqlite:///{self.state}")
        try:
            getattr(store, act)(*args)
        finally:
            store.close()

    def passes(self) -> list[str]:
        store = open_store(f"sqlite:///{self.state}")
        try:
            return [record.mode for record in store.recent_passes(20)]
        finally:
            store.close()


def gauge(runner: PassRunner, name: str) -> float | None:
    return runner.metrics.registry.get_sample_value(name)


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


def test_a_pass_applies_records_and_hands_its_metrics_over(world: World) -> None:
    runner = world.runner()
    outcome = world.scheduled(runner)
    assert outcome is not None and outcome.record.mode == "apply"
    assert any(kind == "create" for kind, _ in world.litellm.writes)  # the control: this fleet does get written
    assert world.passes() == ["apply"]
    assert "fleetllm_reconcile_last_pass_timestamp_seconds" in world.metrics.read_text()
    assert gauge(runner, "fleetllm_reconcile_suspended") == 0 and gauge(runner, "fleetllm_reconcile_pinned") == 0
    runner.close()


def test_a_held_lock_skips_the_pass_before_the_controls_are_read(world: World) -> None:
    world.control("request_sync", ACTOR, 1.0, "now please")
    runner = world.runner()
    with file_lock(world.lock):  # another pass (a `fleetllm apply`, the other loop) holds it
        assert world.scheduled(runner) is None
    assert world.litellm.writes == []
    assert world.passes() == []  # nothing recorded
    assert not world.metrics.exists()  # a skipped pass hands nothing over (it would blank the holder's gauges)
    assert gauge(runner, "fleetllm_reconcile_skipped_total") == 1
    store = open_store(f"sqlite:///{world.state}")
    try:
        assert store.control().sync is not None  # the sync request waits for the pass that takes the lock
    finally:
        store.close()
    assert world.scheduled(runner) is not None  # the lock free: the pass runs and takes the request
    store = open_store(f"sqlite:///{world.state}")
    try:
        assert store.control().sync is None
    finally:
        store.close()
    runner.close()


def test_a_suspended_fleet_is_observed_and_recorded_but_nothing_is_written(world: World) -> None:
    world.control("suspend", ACTOR, 1.0, "LiteLLM maintenance")
    runner = world.runner()
    outcome = world.scheduled(runner)
    assert outcome is not None and outcome.record.mode == "suspended"
    assert outcome.plan.actions  # the plan is made (and shown, recorded) ...
    assert world.litellm.writes == []  # ... and none of it written
    assert world.passes() == ["suspended"]
    assert gauge(runner, "fleetllm_reconcile_suspended") == 1
    world.control("resume", ACTOR, 2.0)
    resumed = world.scheduled(runner)
    assert resumed is not None and resumed.record.mode == "apply" and world.litellm.writes
    runner.close()


def test_a_pinned_fleet_works_from_the_pin(world: World) -> None:
    pinned = git(world.repo, "rev-parse", "HEAD")
    text = (world.repo / "placement.yaml").read_text()
    (world.repo / "placement.yaml").write_text(text.split("  127.0.0.3:")[0])  # the newest drops three boxes
    git(world.repo, "commit", "-qam", "one box")
    newest = git(world.repo, "rev-parse", "HEAD")
    world.control("pin", pinned, ACTOR, 1.0, "the newest is bad")
    runner = world.runner()
    outcome = world.scheduled(runner)
    assert runner.fleet is not None and runner.fleet.revision == newest  # what the branch has ...
    assert outcome is not None and outcome.intended.revision == pinned  # ... and what the pass worked from
    assert outcome.record.revision == pinned
    assert {box for box, _ in outcome.intended.servers} > {HEALTHY_BOX}  # the pinned revision's four boxes
    assert gauge(runner, "fleetllm_reconcile_pinned") == 1
    world.control("unpin", ACTOR, 2.0)
    unpinned = world.scheduled(runner)
    assert unpinned is not None and unpinned.intended.revision == newest
    runner.close()


@pytest.mark.parametrize("where", ["config", "options"])
def test_a_dry_run_records_the_pass_and_writes_nothing(world: World, where: str) -> None:
    if where == "config":
        world.write_config("reconcile: {dry_run: true}\n")
    runner = world.runner(dry_run=True) if where == "options" else world.runner()
    outcome = world.scheduled(runner)
    assert outcome is not None and outcome.record.mode == "plan"
    assert outcome.plan.actions and world.litellm.writes == []
    assert world.passes() == ["plan"]  # recorded: the histories advance, the status page shows it
    assert world.metrics.exists()  # a dry run ran: its metrics are handed over
    runner.close()


def test_an_invalid_head_passes_on_the_last_valid_commit(world: World) -> None:
    valid = git(world.repo, "rev-parse", "HEAD")
    head = break_branch(world.repo)
    runner = world.runner()
    outcome = world.scheduled(runner)
    assert outcome is not None
    assert runner.invalid_head is not None and runner.invalid_head.revision == head
    assert runner.invalid_head.serving == valid and outcome.intended.revision == valid
    assert outcome.record.head == head and outcome.record.head_errors  # the record names the head passed over
    assert any("unknown model 'no-such-model'" in line for line in world.said)
    assert any(line.startswith("fleetllm reconcile: the branch head ") for line in world.said)  # the command named
    assert world.litellm.writes  # an invalid head never stops reconciling
    runner.close()


def test_the_loop_keeps_the_last_fleet_when_the_branch_cannot_be_read(world: World, tmp_path: Path) -> None:
    runner = world.runner()
    first = world.scheduled(runner)
    assert first is not None
    shutil.move(world.repo, tmp_path / "moved")  # the repository is gone for a while
    again = world.scheduled(runner)
    assert again is not None and again.intended.revision == first.intended.revision
    runner.close()


def test_no_valid_commit_at_all_is_an_error_of_the_tree(tmp_path: Path) -> None:
    repo = tmp_path / "fleet"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "placement.yaml").write_text("hosts:\n  203.0.113.10:\n    - [no-such-model, 8001]\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "only an invalid commit")
    world = World(tmp_path / "w")
    world.repo = repo
    world.write_config()
    runner = world.runner()
    with pytest.raises(InvalidFleetError, match="no valid commit was found behind it") as caught:
        runner.read()
    assert caught.value.exit_code == EXIT_INVALID
    with pytest.raises(InvalidFleetError):
        asyncio.run(runner.scheduled_pass())  # the first read of a loop has no last fleet to keep


def test_the_options_refuse_pruning_without_an_adopt_source() -> None:
    with pytest.raises(ConfigurationError, match="--prune-adopted needs --adopt SOURCE"):
        RunnerOptions("plan", prune_adopted=True)
    assert RunnerOptions("plan", adopt=AdoptSource.LLMAO, prune_adopted=True).prune_adopted


def test_the_pass_commands_map_the_runners_errors_to_their_exit_statuses(world: World, tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str],
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    config = str(world.config_file)
    # A revision that is not there: the pass could not run (1), not usage (2: `plan --detailed-exitcode`
    # would read it as "there are changes").
    assert main(["plan", "--config", config, "--against", "f" * 40]) == EXIT_INVALID
    assert capsys.readouterr().err.startswith("fleetllm plan: ")
    # A state store that cannot be opened (its directory is a file): 1, named.
    assert main(["reconcile", "--once", "--config", config, "--state", f"sqlite:///{world.config_file}/x.db",
                 "--lock-file", str(world.lock)]) == EXIT_INVALID
    assert "fleetllm reconcile: state store: " in capsys.readouterr().err
    # A --repo that is not a directory is usage.
    assert main(["plan", "--config", config, "--repo", str(tmp_path / "nowhere")]) == EXIT_USAGE
    assert f"fleetllm plan: --repo {tmp_path / 'nowhere'}: no such directory" in capsys.readouterr().err
