"""Reading a commit whose object is corrupt or missing: one SourceError naming the commit and the file."""

from __future__ import annotations

import zlib
from pathlib import Path

import pytest

from fleetllm.adapters.git import GitFleetRepo
from fleetllm.errors import SourceError
from tests.conftest import git


def corrupt_loose_object(git_dir: Path, sha: str) -> None:
    """Overwrite a loose object with bytes that do not inflate to it (bad checksum, bad content)."""
    path = git_dir / "objects" / sha[:2] / sha[2:]
    path.chmod(0o644)
    path.write_bytes(zlib.compress(b"blob 9\0garbage!!")[:-4] + b"XXXX")


def test_a_corrupt_blob_is_named(fleet_git: Path) -> None:
    (fleet_git / "placement.yaml").write_text((fleet_git / "placement.yaml").read_text() + "\n")
    git(fleet_git, "commit", "-qam", "touch")
    head = git(fleet_git, "rev-parse", "HEAD")
    corrupt_loose_object(fleet_git / ".git", git(fleet_git, "rev-parse", "HEAD:placement.yaml"))
    repo = GitFleetRepo(fleet_git)
    try:
        with pytest.raises(SourceError, match=rf"^{head[:12]}:placement.yaml: cannot read the git object"):
            repo.snapshot(head)
        assert repo.snapshot("HEAD~1").files["placement.yaml"]  # the next read still works
    finally:
        repo.repo.close()
