"""Shared fixtures: a fleet repository built from the example, as a directory or a real git repo."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

# The integration gate (FLEETLLM_REQUIRE_INTEGRATION=1: an integration skip is a failure), and pytester to
# test that gate itself (tests/support/test_integration_gate.py).
pytest_plugins = ["tests.support.integration", "pytester"]

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "fleet-repo-example"
TEST_SALT = "test-salt-0123456789abcdef"
TEST_LEGACY_KEY = "sk-legacy-test-key"


def git(repo: Path, *args: str) -> str:
    result = subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                            env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid",
                                 "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.invalid",
                                 "PATH": "/usr/bin:/bin:/usr/local/bin", "HOME": str(repo)})
    return result.stdout.strip()


@pytest.fixture(autouse=True)
def no_found_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test reads a control-plane config it did not write: FLEETLLM_CONFIG unset, and the default places
    (fleetllm.cli.common.find_config) moved where nothing is, but ./fleetllm.yaml (the tests' own)."""
    from fleetllm.cli import common

    monkeypatch.delenv(common.CONFIG_ENV, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", "/nonexistent/fleetllm-tests/xdg")
    monkeypatch.setattr(common, "SYSTEM_CONFIG", Path("/nonexistent/fleetllm-tests/etc/config.yaml"))


@pytest.fixture
def fleet_dir(tmp_path: Path) -> Path:
    """A writable copy of fleet-repo-example."""
    target = tmp_path / "fleet"
    shutil.copytree(EXAMPLE, target, ignore=shutil.ignore_patterns(".github"))
    return target


@pytest.fixture
def fleet_git(fleet_dir: Path) -> Path:
    """fleet-repo-example as a real git repository with one commit on main."""
    git(fleet_dir, "init", "-q", "-b", "main")
    git(fleet_dir, "add", "-A")
    git(fleet_dir, "commit", "-q", "-m", "initial fleet")
    return fleet_dir
