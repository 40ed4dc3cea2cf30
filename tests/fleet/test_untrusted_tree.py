"""A pull request's tree is untrusted (issue 16, findings 4 and 9).

- Symbolic links and other non-regular files among the fleet files are refused, never followed nor
  read: `placement.yaml -> /some/secret` printed the secret in the error and in GitHub's annotations,
  a link to /dev/zero read without bound. On disk (`validate DIR`) and in git objects (`validate --rev`,
  `diff`, the control plane: a committed link is a blob of mode 120000).
- An integer of more than 4,300 digits (Python's int conversion limit) ended `validate` and `diff` in a
  traceback; it is a diagnostic at its line now.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from fleetllm.adapters.git import read_commit, read_directory
from fleetllm.cli.main import main
from fleetllm.core.fleet.strictyaml import MAX_BYTES
from tests.conftest import git

SECRET = "top-secret-value-Zq81"


@pytest.fixture(autouse=True)
def _no_ambient_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("FLEETLLM_VLLM_API_SALT", "FLEETLLM_LEGACY_API_KEY", "GITHUB_ACTIONS"):
        monkeypatch.delenv(name, raising=False)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out + err


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    path = tmp_path / "secret.yaml"
    path.write_text(f"hosts: {SECRET}\n")  # YAML whose content a schema error would quote
    return path


@pytest.mark.parametrize("fmt", ["text", "json", "github"])
def test_validate_dir_refuses_a_link_without_reading_it(fleet_dir: Path, secret_file: Path, fmt: str,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    (fleet_dir / "placement.yaml").unlink()
    (fleet_dir / "placement.yaml").symlink_to(secret_file)
    code, out = run(capsys, "validate", str(fleet_dir), "--format", fmt)
    assert code == 1
    assert SECRET not in out and str(secret_file) not in out
    assert "placement.yaml" in out and "a symbolic link, not a regular file" in out
    assert "not-a-regular-file" in out


@pytest.mark.parametrize("make", ["dev-zero", "fifo", "directory", "dangling-link"])
def test_validate_dir_refuses_other_files_at_once(fleet_dir: Path, make: str, capsys: pytest.CaptureFixture[str]
                                                  ) -> None:
    path = fleet_dir / "models.yaml"
    path.unlink()
    if make == "dev-zero":
        path.symlink_to("/dev/zero")
    elif make == "fifo":
        os.mkfifo(path)  # nobody writes: a read would block for ever
    elif make == "directory":
        path.mkdir()
    else:
        path.symlink_to(fleet_dir / "nowhere")
    started = time.monotonic()
    snapshot = read_directory(fleet_dir)
    assert time.monotonic() - started < 30  # generous: only "it returned" matters, a read of /dev/zero never would
    code, out = run(capsys, "validate", str(fleet_dir))
    assert code == 1 and "models.yaml:1:1: " in out and "not a regular file" in out, out
    assert not isinstance(snapshot.files["models.yaml"], bytes)


def test_an_oversized_file_is_not_read_past_the_limit(fleet_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with (fleet_dir / "placement.yaml").open("ab") as fh:
        fh.truncate(MAX_BYTES + 1)  # sparse: cheap to make
    code, out = run(capsys, "validate", str(fleet_dir))
    assert code == 1 and "the limit is 16,777,216" in out


def commit_link(repo: Path, name: str, target: str) -> str:
    (repo / name).unlink()
    (repo / name).symlink_to(target)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", f"{name} as a link")
    return git(repo, "rev-parse", "HEAD")


def test_a_committed_link_is_refused_from_git_objects(fleet_git: Path, secret_file: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    head = commit_link(fleet_git, "placement.yaml", str(secret_file))
    assert git(fleet_git, "ls-tree", "HEAD", "placement.yaml").startswith("120000 blob")
    snapshot = read_commit(fleet_git, head)
    assert not isinstance(snapshot.files["placement.yaml"], bytes)
    code, out = run(capsys, "validate", str(fleet_git), "--rev", "HEAD", "--format", "github")
    assert code == 1 and SECRET not in out and str(secret_file) not in out
    assert "::error file=" in out and "placement.yaml,line=1,col=1," in out and "a symbolic link" in out
    code, out = run(capsys, "diff", "main~1", "main", "--repo", str(fleet_git))
    assert code == 1 and "a symbolic link" in out and SECRET not in out and str(secret_file) not in out


def test_a_committed_directory_link_out_of_the_repository_is_refused(fleet_git: Path, tmp_path: Path,
                                                                     secret_file: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    for name in ("fleet.yaml", "models.yaml"):
        (outside / name).write_text((fleet_git / name).read_text())
    (outside / "placement.yaml").symlink_to(secret_file)
    (fleet_git / "sub").symlink_to(outside)
    git(fleet_git, "add", "-A")
    git(fleet_git, "commit", "-qm", "a directory link")
    code, out = run(capsys, "validate", str(fleet_git / "sub"), "--rev", "HEAD")
    assert code == 2 and "not inside the git repository" in out and SECRET not in out


HUGE = "9" * 5000


def test_a_5000_digit_integer_is_a_diagnostic_in_validate(fleet_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = fleet_dir / "fleet.yaml"
    path.write_text(path.read_text() + f"max_servers_per_box: {HUGE}\n")
    line = path.read_text().splitlines().index(f"max_servers_per_box: {HUGE}") + 1
    code, out = run(capsys, "validate", str(fleet_dir), "--format", "json")
    assert code == 1
    (diagnostic,) = [d for d in json.loads(out)["diagnostics"] if d["rule"] == "yaml-number-too-large"]
    assert diagnostic["file"].endswith("fleet.yaml") and diagnostic["line"] == line
    assert "an integer of 5,000 digits" in diagnostic["message"] and HUGE not in out


def test_a_5000_digit_integer_is_a_diagnostic_in_diff(fleet_git: Path, capsys: pytest.CaptureFixture[str]) -> None:
    git(fleet_git, "checkout", "-q", "-b", "pr")
    path = fleet_git / "models.yaml"
    path.write_text(path.read_text().replace("max_model_len: 40960", f"max_model_len: {HUGE}", 1))
    git(fleet_git, "commit", "-qam", "huge")
    code, out = run(capsys, "diff", "--repo", str(fleet_git), "--base-branch", "main")
    assert code == 1 and "Cannot compare: HEAD" in out and "yaml-number-too-large" in out
    assert "Traceback" not in out
