"""Reading a fleet repository's files: from a directory, or from a git commit's objects.

This is the only I/O in the fleet package. A commit is read from git objects (no checkout), so the
control plane and `validate --rev` never touch a working tree.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from llmfleet.core.fleet.strictyaml import MAX_BYTES

FLEET_FILE = "fleet.yaml"
MODELS_FILE = "models.yaml"
PLACEMENT_FILE = "placement.yaml"
FLEET_FILES = (FLEET_FILE, MODELS_FILE, PLACEMENT_FILE)
WORKTREE_REVISION = "working-tree"


class SourceError(Exception):
    """The repository could not be read at all (missing directory, not a git repo, unknown rev)."""


@dataclass(frozen=True)
class Oversized:
    size: int


Content = bytes | Oversized | None  # None: the file does not exist


@dataclass(frozen=True)
class Snapshot:
    """The fleet files at one revision. `display` maps a file name to the path shown in messages."""

    revision: str
    files: Mapping[str, Content]
    display: Mapping[str, str]


def _display_paths(prefix: str) -> dict[str, str]:
    return {name: os.path.normpath(os.path.join(prefix, name)) if prefix else name for name in FLEET_FILES}


def read_directory(directory: str | os.PathLike[str]) -> Snapshot:
    root = Path(directory)
    if not root.is_dir():
        raise SourceError(f"{directory}: not a directory")
    files: dict[str, Content] = {}
    for name in FLEET_FILES:
        path = root / name
        try:
            size = path.stat().st_size
            files[name] = Oversized(size) if size > MAX_BYTES else path.read_bytes()
        except FileNotFoundError:
            files[name] = None
        except OSError as exc:
            raise SourceError(f"{path}: {exc.strerror}") from None
    prefix = "" if os.path.abspath(directory) == os.getcwd() else os.fspath(directory)
    return Snapshot(WORKTREE_REVISION, files, _display_paths(prefix))


class GitFleetRepo:
    """A fleet repository in git; `subdir` is where the fleet files sit inside it ("" for the root)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        import git  # GitPython: imported here so that pure users of the package never need git

        try:
            self.repo = git.Repo(path, search_parent_directories=True)
        except (git.NoSuchPathError, git.InvalidGitRepositoryError):
            raise SourceError(f"{path}: not inside a git repository") from None
        top = Path(self.repo.working_tree_dir or self.repo.git_dir).resolve()
        here = Path(path).resolve()
        self.subdir = PurePosixPath(here.relative_to(top).as_posix()) if here != top else PurePosixPath("")
        self.display_prefix = os.fspath(path) if here != Path.cwd().resolve() else ""

    def resolve(self, rev: str) -> str:
        import git

        try:
            return str(self.repo.commit(rev).hexsha)
        except (git.BadName, ValueError, git.GitCommandError):
            raise SourceError(f"{rev}: no such revision in {self.repo.working_tree_dir}") from None

    def snapshot(self, rev: str) -> Snapshot:
        import git

        sha = self.resolve(rev)
        tree = self.repo.commit(sha).tree
        files: dict[str, Content] = {}
        for name in FLEET_FILES:
            path = str(self.subdir / name) if str(self.subdir) not in ("", ".") else name
            try:
                blob = tree / path
            except KeyError:
                files[name] = None
                continue
            try:  # a missing or corrupt object fails here, in `size` or in the read
                if blob.type != "blob":
                    files[name] = None
                elif blob.size > MAX_BYTES:
                    files[name] = Oversized(blob.size)
                else:
                    files[name] = blob.data_stream.read()
            except (git.GitCommandError, ValueError, OSError) as exc:
                raise SourceError(f"{sha[:12]}:{path}: cannot read the git object: {exc}") from None
        return Snapshot(sha, files, _display_paths(self.display_prefix))


def read_commit(path: str | os.PathLike[str], rev: str) -> Snapshot:
    return GitFleetRepo(path).snapshot(rev)
