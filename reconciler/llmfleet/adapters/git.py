"""The tracked fleet repository: a local repository read in place, or a remote URL in a bare clone of
our own, fetched with a forced refspec so that a force-pushed branch simply replaces the old one.

Files are always read from git objects (llmfleet.adapters.fleetsource.GitFleetRepo), never a checkout.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path, PurePosixPath

from llmfleet.adapters.fleetsource import GitFleetRepo, Snapshot, SourceError
from llmfleet.adapters.state.store import is_postgres, sqlite_path
from llmfleet.settings import ControlPlaneConfig, RepoConfig

GIT_TIMEOUT_S = 120
_USERINFO = re.compile(r"(?<=://)[^/@\s]+@")


def redact_url(text: str) -> str:
    """`https://user:token@host/x` -> `https://***@host/x` (also inside git's messages)."""
    return _USERINFO.sub("***@", text)


def _git(*args: str, cwd: Path | None = None) -> str:
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "/bin/false", "LC_ALL": "C"}
    try:
        result = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=GIT_TIMEOUT_S,
                                env=env, check=False)
    except subprocess.TimeoutExpired:
        raise SourceError(f"git {args[0]} took longer than {GIT_TIMEOUT_S} s") from None
    except OSError as exc:
        raise SourceError(f"cannot run git: {exc.strerror}") from None
    if result.returncode != 0:
        message = redact_url(result.stderr.strip().splitlines()[-1] if result.stderr.strip() else "failed")
        raise SourceError(f"git {args[0]}: {message}")
    return result.stdout


def default_clone_dir(config: ControlPlaneConfig, name: str = "fleet-repo.git") -> Path:
    """Beside the SQLite state file (or the config file when the store is in memory or PostgreSQL)."""
    db = None if is_postgres(config.state.url) else sqlite_path(config.state.url, config.state.base)
    return (db.parent if db is not None else config.source.resolve().parent) / name


class TrackedRepo:
    """One branch of the fleet repository. `update()` fetches (remote) and `head()` resolves the branch."""

    def __init__(self, config: RepoConfig, default_clone_dir: Path) -> None:
        self.config = config
        self.branch = config.branch
        self.remote = config.url is not None
        self.clone_dir = config.clone_dir or default_clone_dir
        self._repo: GitFleetRepo | None = None

    @property
    def where(self) -> str:
        """What to call the repository in messages (credentials removed)."""
        return redact_url(self.config.url) if self.config.url else str(self.config.path)

    @property
    def git_dir(self) -> Path:
        return Path(self.fleet_repo.repo.git_dir)

    @property
    def fleet_files_dir(self) -> PurePosixPath:
        """Where the fleet files sit inside the repository."""
        return self.fleet_repo.subdir

    @property
    def fleet_repo(self) -> GitFleetRepo:
        if self._repo is None:
            self._repo = self._open()
        return self._repo

    def _open(self) -> GitFleetRepo:
        if self.remote:
            self._clone()
            repo = GitFleetRepo(self.clone_dir)
        else:
            assert self.config.path is not None
            repo = GitFleetRepo(self.config.path)
        if self.config.subdir is not None:
            repo.subdir = PurePosixPath(self.config.subdir.strip("/"))
        repo.display_prefix = "" if str(repo.subdir) in ("", ".") else str(repo.subdir)
        return repo

    def _clone(self) -> None:
        assert self.config.url is not None
        if (self.clone_dir / "HEAD").is_file():
            origin = _git("config", "--get", "remote.origin.url", cwd=self.clone_dir).strip()
            if origin != self.config.url:
                raise SourceError(f"{self.clone_dir} is a clone of {redact_url(origin)}, not of {self.where}; "
                                  "remove it or set repo.clone_dir elsewhere")
            return
        if self.clone_dir.exists() and any(self.clone_dir.iterdir()):
            raise SourceError(f"clone_dir {self.clone_dir} exists and is not empty; remove it or choose another")
        self.clone_dir.parent.mkdir(parents=True, exist_ok=True)
        _git("clone", "--quiet", "--bare", "--single-branch", "--branch", self.branch, "--", self.config.url,
             str(self.clone_dir))

    def update(self) -> None:
        """Bring the branch up to date: a forced fetch for a remote, nothing for a local repository."""
        repo = self.fleet_repo
        if self.remote:
            _git("fetch", "--quiet", "--prune", "--no-tags", "origin",
                 f"+refs/heads/{self.branch}:refs/heads/{self.branch}", cwd=Path(repo.repo.git_dir))

    def head(self) -> str:
        try:
            return self.fleet_repo.resolve(f"refs/heads/{self.branch}")
        except SourceError:
            raise SourceError(f"branch {self.branch!r} not found in {self.where}") from None

    def snapshot(self, revision: str) -> Snapshot:
        return self.fleet_repo.snapshot(revision)

    def close(self) -> None:
        """Stop GitPython's persistent `git cat-file` helpers."""
        if self._repo is not None:
            self._repo.repo.close()
            self._repo = None

    def first_parent(self, revision: str) -> str | None:
        parents = self.fleet_repo.repo.commit(revision).parents
        return str(parents[0].hexsha) if parents else None
