"""`fleetllm plan/apply/reconcile` on a control plane that tracks a remote repository (`repo.url`): each
pass fetches the tracked branch into the reconciler's own bare clone (not the control plane's) and
reads the fleet from it; an invalid head or an unreachable remote is an error naming the repository,
never its credentials."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from fleetllm.core.fleet.model import Fleet
from fleetllm.errors import SourceError
from fleetllm.job.configfile import JobConfig, load_config
from fleetllm.job.source import FleetSource, InvalidFleetError
from tests.conftest import git

ENV = {"FK": "fleet-key-0123", "SALT": "salt-0123456789abcdef", "MK": "sk-master"}


def config_for(tmp_path: Path, url: str, repo_extra: str = "") -> Path:
    path = tmp_path / "cp" / "control-plane.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"repo: {{url: '{url}', branch: main{repo_extra}}}\n"
                    "secrets: {fleet_key: '${env:FK}', vllm_api_salt: '${env:SALT}'}\n"
                    "state: {url: 'sqlite:///state/cp.sqlite3'}\n"
                    "litellm: {url: 'http://127.0.0.1:4000', master_key: '${env:MK}'}\n")
    return path


def load_fleet(source: dict[str, str | None], config: JobConfig) -> Fleet:
    """The fleet as `fleetllm apply` reads it (--repo, --rev as given), its words for a person dropped."""
    return FleetSource(config, source.get("repo"), source.get("rev")).load(lambda _text: None)


def args(**given: str | None) -> dict[str, str | None]:
    return given


def test_each_load_fetches_the_branch_into_the_reconcilers_own_clone(fleet_git: Path, tmp_path: Path) -> None:
    remote = tmp_path / "fleet.git"
    git(tmp_path, "clone", "-q", "--bare", str(fleet_git), str(remote))
    config = load_config(config_for(tmp_path, str(remote)), ENV)
    assert config.clone_dir == tmp_path / "cp" / "state" / "fleet-repo-reconcile.git"  # beside the state file
    first = git(fleet_git, "rev-parse", "HEAD")
    assert load_fleet(args(), config).revision == first
    assert (config.clone_dir / "HEAD").is_file()

    (fleet_git / "README.md").write_text("a change the next pass must see\n")
    git(fleet_git, "add", "-A")
    git(fleet_git, "commit", "-qm", "second")
    git(fleet_git, "push", "-q", str(remote), "main")
    second = git(fleet_git, "rev-parse", "HEAD")
    assert load_fleet(args(), config).revision == second
    assert load_fleet(args(rev=first), config).revision == first  # --rev: a commit of the fetched branch
    assert load_fleet(args(repo=str(fleet_git)), config).revision == "working-tree"  # --repo DIR still wins
    assert load_fleet(args(repo=str(remote)), config).revision == second  # a bare one: its HEAD

    with (fleet_git / "placement.yaml").open("a") as fh:
        fh.write("  203.0.113.98:\n    servers:\n      - [no-such-model, 8001]\n")
    git(fleet_git, "commit", "-qam", "broken")
    git(fleet_git, "push", "-q", str(remote), "main")
    with pytest.raises(InvalidFleetError, match="is not valid: nothing is planned or applied"):
        load_fleet(args(), config)


def test_an_unreachable_remote_names_the_repository_not_its_credentials(fleet_git: Path, tmp_path: Path) -> None:
    remote = tmp_path / "fleet.git"
    git(tmp_path, "clone", "-q", "--bare", str(fleet_git), str(remote))
    config = load_config(config_for(tmp_path, str(remote)), ENV)
    load_fleet(args(), config)
    shutil.rmtree(remote)
    with pytest.raises(SourceError, match=f"{remote}: git fetch"):
        load_fleet(args(), config)

    secret = "ghp_not-for-any-log-0123"
    url = f"https://x-access-token:{secret}@127.0.0.1:9/acme/fleet.git"
    with pytest.raises(SourceError) as caught:
        load_fleet(args(), load_config(config_for(tmp_path / "other", url), ENV))
    assert str(caught.value).startswith("https://***@127.0.0.1:9/acme/fleet.git: git clone: ")
    assert secret not in str(caught.value)


def test_beside_the_control_planes_own_clone_when_it_has_one(tmp_path: Path) -> None:
    path = config_for(tmp_path, "https://git.example.com/fleet.git", ", clone_dir: /var/lib/fleetllm/fleet-repo.git")
    assert load_config(path, ENV).clone_dir == Path("/var/lib/fleetllm/fleet-repo-reconcile.git")
