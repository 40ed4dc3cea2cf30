"""The demo reconciles with the shipped pass (fleetllm.job.runner.PassRunner.scheduled_pass, what each
pass of `fleetllm reconcile`'s loop runs), not a copy: the demo's own workspace, config and SQLite state
store, the example fleet simulated in a git repository; its LiteLLM cases are the runner's seams. No
box runs here: every server is Pending, and what is checked is what the runner did around the pass."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

import fleetllm.demo
from fleetllm.adapters.git import read_directory
from fleetllm.adapters.state import open_store
from fleetllm.adapters.state.locks import default_lock_path, file_lock
from fleetllm.demo.fleet import simulate
from fleetllm.demo.reconciler import MemoryLitellm, reconciler
from fleetllm.demo.workspace import Workspace, control_plane_config, create, init_fleet_repo
from tests.conftest import EXAMPLE


@pytest.fixture
def workspace(tmp_path: Path) -> Workspace:
    workspace = create(tmp_path / "demo")
    init_fleet_repo(workspace, simulate(read_directory(str(EXAMPLE)), "127.251.250.2").files)
    control_plane_config(workspace, 9, None)  # no LiteLLM given
    return workspace


def modes(workspace: Workspace) -> list[str]:
    store = open_store(workspace.state_url)
    try:
        return [record.mode for record in store.recent_passes(10)]
    finally:
        store.close()


def test_the_demo_has_no_pass_of_its_own() -> None:
    sources = {path.name: path.read_text() for path in Path(fleetllm.demo.__file__).parent.glob("*.py")}
    for name, text in sources.items():
        for call in ("run_pass(", "pass_lock(", "take_sync_request(", "build_reconciler("):
            assert call not in text, f"fleetllm/demo/{name} calls {call}: the demo runs the job's PassRunner"
    assert re.search(r"asyncio\.run\(self\.runner\.scheduled_pass\(\)\)", sources["run.py"])


def test_without_a_proxy_the_demo_runs_real_passes_in_which_the_boxes_route(workspace: Workspace) -> None:
    runner = reconciler(workspace, None, rollouts=False)
    try:
        assert runner.options.dry_run is None and runner.options.litellm is None  # the config's, as `reconcile`
        outcome = asyncio.run(runner.scheduled_pass())
        assert outcome is not None and outcome.record.mode == "apply"
        assert runner.fleet is not None and outcome.intended.revision == runner.fleet.revision
        assert outcome.observation.boxes_route and outcome.observation.deployments is None  # LiteLLM not listed
        assert outcome.record.errors == ()  # and that is no failure
        assert outcome.rollout is not None  # the rollout runs (the boxes have not reported yet: nothing to release)
    finally:
        runner.close()
    assert modes(workspace) == ["apply"]  # recorded in the control plane's store, for its status page
    store = open_store(workspace.state_url)
    try:
        assert store.current_rollout()[0] is not None  # the rollout is kept: `fleetllm rollout pause` has one
    finally:
        store.close()


def test_a_dry_run_releases_nothing_and_writes_nothing(workspace: Workspace) -> None:
    from fleetllm.job.configfile import load_config
    from fleetllm.job.runner import PassRunner, RunnerOptions

    runner = PassRunner(RunnerOptions(command="demo", dry_run=True), load_config(workspace.config),
                        say=lambda _text: None)
    try:
        outcome = asyncio.run(runner.scheduled_pass())
        assert outcome is not None and outcome.record.mode == "plan"
        assert outcome.record.rollout is not None  # what the step would do is recorded ...
    finally:
        runner.close()
    store = open_store(workspace.state_url)
    try:
        assert store.current_rollout()[0] is None and store.box_releases() == {}  # ... and nothing is saved
    finally:
        store.close()


def test_a_rollout_scenario_without_a_proxy_applies_to_the_table_in_memory(workspace: Workspace) -> None:
    runner = reconciler(workspace, None, rollouts=True)
    try:
        assert runner.options.dry_run is None  # the config's (false): the passes apply
        assert runner.options.litellm is not None and isinstance(runner.options.litellm(None), MemoryLitellm)  # type: ignore[arg-type]
        outcome = asyncio.run(runner.scheduled_pass())
        assert outcome is not None and outcome.record.mode == "apply"
    finally:
        runner.close()


def test_the_demos_passes_honour_the_lock_and_the_controls(workspace: Workspace) -> None:
    """The order of `fleetllm reconcile`: the lock, then the controls (the old demo read them first)."""
    store = open_store(workspace.state_url)
    try:
        store.suspend("admin:sha256:0a1b2c3d", 1.0, "watching the demo")
        store.request_sync("admin:sha256:0a1b2c3d", 1.0)
    finally:
        store.close()
    runner = reconciler(workspace, None, rollouts=True)
    try:
        with file_lock(default_lock_path(workspace.state_file)):  # a `fleetllm apply --config` in a terminal
            assert asyncio.run(runner.scheduled_pass()) is None
        store = open_store(workspace.state_url)
        try:
            assert store.control().sync is not None  # not taken: the pass did not get the lock
        finally:
            store.close()
        outcome = asyncio.run(runner.scheduled_pass())
        assert outcome is not None and outcome.record.mode == "suspended"
    finally:
        runner.close()
    assert modes(workspace) == ["suspended"]
