"""The reconcile job sets the commit statuses: the shipped pass runner (PassRunner.scheduled_pass, what
`fleetllm reconcile` runs) over a real git repository, its SQLite state store and a config with a forge
section pointing at the fake GitHub process, which checks each SHA against that repository. No box runs:
the fleet has no agent-managed box, so each rollout starts and converges in the pass that starts it."""

from __future__ import annotations

import asyncio
from pathlib import Path

from fleetllm.adapters.git import read_directory
from fleetllm.demo.fleet import simulate
from fleetllm.demo.reconciler import reconciler
from fleetllm.demo.workspace import DemoForge, commit_file, control_plane_config, create, init_fleet_repo
from fleetllm.job.configfile import load_config
from fleetllm.job.runner import PassRunner, RunnerOptions
from tests.conftest import EXAMPLE
from tests.support.fake_forge import fake_forge

STARTED = "Rolling out: agent-managed boxes move to it in waves"


def test_each_recorded_pass_sets_the_statuses_of_its_transitions(tmp_path: Path) -> None:
    workspace = create(tmp_path / "demo")
    first = init_fleet_repo(workspace, simulate(read_directory(str(EXAMPLE)), "127.251.249.2").files)
    with fake_forge(tmp_path / "forge", git_dir=workspace.fleet) as forge:
        control_plane_config(workspace, 9, None, DemoForge(forge.url, forge.repository, forge.token_file))
        runner: PassRunner = reconciler(workspace, None, rollouts=True)
        try:
            asyncio.run(runner.scheduled_pass())
            asyncio.run(runner.scheduled_pass())  # nothing moved: nothing set
            placement = (workspace.fleet / "placement.yaml").read_text()
            second = commit_file(workspace, "placement.yaml", placement + "\n# a comment\n", "A comment")
            asyncio.run(runner.scheduled_pass())
        finally:
            runner.close()  # waits for the statuses still queued (forge.drain_timeout_s)
        for sha in (first, second):
            assert forge.states(sha) == [("pending", STARTED),
                                         ("success", "Converged: every agent-managed box runs it (0 waves)")]
            newest = forge.statuses(sha)[0]
            assert newest["context"] == "fleetllm/rollout" and newest["target_url"] == "http://127.0.0.1:9/revision#rollout"
        assert forge.violations() == []
        assert len([r for r in forge.state()["requests"] if r["method"] == "POST"]) == 4


def test_a_dry_run_sets_nothing(tmp_path: Path) -> None:
    workspace = create(tmp_path / "demo")
    init_fleet_repo(workspace, simulate(read_directory(str(EXAMPLE)), "127.251.248.2").files)
    with fake_forge(tmp_path / "forge") as forge:
        control_plane_config(workspace, 9, None, DemoForge(forge.url, forge.repository, forge.token_file))
        runner = PassRunner(RunnerOptions(command="demo", dry_run=True), load_config(workspace.config),
                            say=lambda _text: None)  # a dry run records no step
        try:
            outcome = asyncio.run(runner.scheduled_pass())
        finally:
            runner.close()
        assert outcome is not None and outcome.record.mode == "plan"
        assert forge.state()["requests"] == []


def test_the_demo_takes_the_forge_flags_together(tmp_path: Path) -> None:
    import argparse

    import pytest

    from fleetllm.cli.common import CommandError
    from fleetllm.cli.demo import _forge

    token = tmp_path / "token"
    token.write_text("ghp_x")

    def args(url: str | None, repository: str | None, token_file: Path | None) -> argparse.Namespace:
        return argparse.Namespace(forge_api_url=url, forge_repository=repository, forge_token_file=token_file)

    assert _forge(args(None, None, None)) is None
    assert _forge(args("http://127.0.0.1:9/", "o/r", token)) == DemoForge("http://127.0.0.1:9", "o/r", token.resolve())
    with pytest.raises(CommandError, match="go together"):
        _forge(args("http://127.0.0.1:9", None, token))
    with pytest.raises(CommandError, match="no such file"):
        _forge(args("http://127.0.0.1:9", "o/r", tmp_path / "missing"))
