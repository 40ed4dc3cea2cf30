"""The one git adapter: the fleet repository read from a directory or from git objects (GitPython, never a
checkout), the tracked branch (a local repository read in place, or a remote URL in a bare clone of our
own, fetched with a forced refspec so that a force-pushed branch simply replaces the old one), and the
commits fleetllm writes itself (approve, the demo). Every git subprocess goes through `run_git`.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Protocol

from fleetllm.core.fleet.files import FLEET_FILES, WORKTREE_REVISION, Content, NotRegularFile, Oversized, Snapshot
from fleetllm.core.fleet.strictyaml import MAX_BYTES
from fleetllm.errors import SourceError

__all__ = [
    "GitFleetRepo",
    "RefMoved",
    "RepoLocation",
    "SourceError",
    "TrackedRepo",
    "commit_blob",
    "commit_worktree_file",
    "commit_worktree_files",
    "identity",
    "is_bare_repository",
    "read_commit",
    "read_directory",
    "read_fleet",
    "redact_url",
    "run_git",
]

GIT_TIMEOUT_S = 120
_USERINFO = re.compile(r"(?<=://)[^/@\s]+@")


def redact_url(text: str) -> str:
    """`https://user:token@host/x` -> `https://***@host/x` (also inside git's messages)."""
    return _USERINFO.sub("***@", text)


def run_git(*args: str, cwd: Path | None = None, git_dir: str | None = None, stdin: str | None = None,
            env: Mapping[str, str] | None = None, base_env: Mapping[str, str] | None = None) -> str:
    """Run one git command; its stdout. `env` adds to `base_env` (default: this process's environment).
    Never prompts for credentials; a failure is a SourceError naming the command, credentials redacted."""
    full_env = {**(os.environ if base_env is None else base_env), **(env or {}),
                "GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "/bin/false", "LC_ALL": "C"}
    argv = ["git", *(("--git-dir", git_dir) if git_dir is not None else ()), *args]
    try:
        result = subprocess.run(argv, cwd=cwd, input=stdin, capture_output=True, text=True, timeout=GIT_TIMEOUT_S,
                                env=full_env, check=False)
    except subprocess.TimeoutExpired:
        raise SourceError(f"git {args[0]} took longer than {GIT_TIMEOUT_S} s") from None
    except OSError as exc:
        raise SourceError(f"cannot run git: {exc.strerror}") from None
    if result.returncode != 0:
        message = redact_url(result.stderr.strip().splitlines()[-1] if result.stderr.strip() else "failed")
        raise SourceError(f"git {args[0]}: {message}")
    return result.stdout


class RepoLocation(Protocol):
    """Where the tracked branch lives (fleetllm.settings.RepoConfig is one)."""

    @property
    def url(self) -> str | None: ...
    @property
    def path(self) -> Path | None: ...
    @property
    def branch(self) -> str: ...
    @property
    def subdir(self) -> str | None: ...
    @property
    def clone_dir(self) -> Path | None: ...


def _display_paths(prefix: str) -> dict[str, str]:
    return {name: os.path.normpath(os.path.join(prefix, name)) if prefix else name for name in FLEET_FILES}


def _kind(mode: int) -> str:
    for test, kind in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "not a regular file"


def read_file(path: Path) -> Content:
    """One fleet file from disk: a regular file of at most MAX_BYTES, read without following a symbolic
    link (O_NOFOLLOW) or blocking on a FIFO (O_NONBLOCK), checked on the open descriptor (no race between
    the check and the read), and never more than MAX_BYTES + 1 bytes read."""
    try:
        before = path.lstat()
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(before.st_mode):
        return NotRegularFile(_kind(before.st_mode))
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # replaced by a link since the lstat
            return NotRegularFile("a symbolic link")
        raise
    with os.fdopen(fd, "rb") as fh:
        opened = os.fstat(fh.fileno())
        if not stat.S_ISREG(opened.st_mode):
            return NotRegularFile(_kind(opened.st_mode))
        if opened.st_size > MAX_BYTES:
            return Oversized(opened.st_size)
        data = fh.read(MAX_BYTES + 1)
    return Oversized(len(data)) if len(data) > MAX_BYTES else data


def read_directory(directory: str | os.PathLike[str]) -> Snapshot:
    root = Path(directory)
    if not root.is_dir():
        raise SourceError(f"{directory}: not a directory")
    files: dict[str, Content] = {}
    for name in FLEET_FILES:
        path = root / name
        try:
            files[name] = read_file(path)
        except OSError as exc:
            raise SourceError(f"{path}: {exc.strerror}") from None
    prefix = "" if os.path.abspath(directory) == os.getcwd() else os.fspath(directory)
    return Snapshot(WORKTREE_REVISION, files, _display_paths(prefix), _worktree_origin(root))


def _worktree_origin(root: Path) -> str | None:
    """The root commit of the git repository holding a working tree, if any (a fleet id is derived from it).
    One `git rev-list`, not GitPython: `fleetllm validate` of a directory imports no git library."""
    try:
        roots = run_git("rev-list", "--max-parents=0", "HEAD", cwd=root).split()
    except SourceError:
        return None
    return min(roots) if roots else None


class GitFleetRepo:
    """A fleet repository in git; `subdir` is where the fleet files sit inside it ("" for the root)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        import git  # GitPython: imported here so that pure users of the package never need git

        try:
            self.repo = git.Repo(path, search_parent_directories=True)
        except git.NoSuchPathError:
            raise SourceError(f"{path}: no such directory") from None
        except git.InvalidGitRepositoryError:
            raise SourceError(f"{path}: not inside a git repository") from None
        top = Path(self.repo.working_tree_dir or self.repo.git_dir).resolve()
        here = Path(path).resolve()
        if here != top and top not in here.parents:
            raise SourceError(f"{path}: not inside the git repository at {top} (a symbolic link out of it?)")
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
                    files[name] = NotRegularFile("a directory" if blob.type == "tree" else "a submodule")
                elif stat.S_ISLNK(blob.mode):  # a symbolic link is a blob of mode 120000 holding its target
                    files[name] = NotRegularFile("a symbolic link")
                elif blob.size > MAX_BYTES:
                    files[name] = Oversized(blob.size)
                else:
                    files[name] = blob.data_stream.read()
            except (git.GitCommandError, ValueError, OSError) as exc:
                raise SourceError(f"{sha[:12]}:{path}: cannot read the git object: {exc}") from None
        return Snapshot(sha, files, _display_paths(self.display_prefix), self.root_of(sha))

    def root_of(self, rev: str) -> str | None:
        """The repository's first commit behind `rev` (the smallest, should history hold several roots):
        what an existing fleet's id is derived from (fleetllm.core.judge.ownership)."""
        import git

        try:
            roots = self.repo.git.rev_list("--max-parents=0", rev).split()
        except git.GitCommandError:
            return None
        return min(roots) if roots else None


    def first_parent(self, revision: str) -> str | None:
        """The commit's first parent (None for a root commit): the walk back past invalid commits."""
        parents = self.repo.commit(revision).parents
        return str(parents[0].hexsha) if parents else None

    def fleet_files_dir(self) -> Path:
        """The folder of the fleet files in the working tree."""
        return Path(self.repo.working_tree_dir or self.repo.git_dir) / self.subdir

    def uncommitted(self) -> tuple[str, ...]:
        """The fleet files whose working-tree content is not HEAD's (edited, staged, new or deleted), by the
        names the fleet reads them under; () in a bare repository."""
        import git

        if self.repo.bare:
            return ()
        paths = {(str(self.subdir / name) if str(self.subdir) not in ("", ".") else name): name
                 for name in FLEET_FILES}
        try:
            out = self.repo.git.status("--porcelain", "--untracked-files=all", "--", *paths)
        except git.GitCommandError as exc:
            raise SourceError(f"{self.repo.working_tree_dir}: git status failed: {exc}") from None
        changed = {line[3:].split(" -> ")[-1].strip('"') for line in out.splitlines() if len(line) > 3}
        return tuple(sorted(name for path, name in paths.items() if path in changed))

    def worktree_snapshot(self) -> Snapshot:
        """The fleet files as they are on disk, uncommitted edits included (revision `working-tree`)."""
        snapshot = read_directory(self.fleet_files_dir())
        return Snapshot(snapshot.revision, snapshot.files, _display_paths(self.display_prefix))


def read_commit(path: str | os.PathLike[str], rev: str) -> Snapshot:
    return GitFleetRepo(path).snapshot(rev)


def is_bare_repository(path: str) -> bool:
    root = Path(path)
    return (root / "HEAD").is_file() and (root / "objects").is_dir() and not (root / "fleet.yaml").exists()


def read_fleet(repo: str, rev: str | None) -> Snapshot:
    """The fleet files of `repo`: its working tree, or the commit `rev` (a bare repository has no working
    tree: its HEAD is read, e.g. the control plane's clone, repo.clone_dir)."""
    if rev is None and is_bare_repository(repo):
        rev = "HEAD"
    return read_commit(repo, rev) if rev else read_directory(repo)


class TrackedRepo:
    """One branch of the fleet repository. `update()` fetches (remote) and `head()` resolves the branch."""

    def __init__(self, config: RepoLocation, default_clone_dir: Path) -> None:
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
            origin = run_git("config", "--get", "remote.origin.url", cwd=self.clone_dir).strip()
            if origin != self.config.url:
                raise SourceError(f"{self.clone_dir} is a clone of {redact_url(origin)}, not of {self.where}; "
                                  "remove it or set repo.clone_dir elsewhere")
            return
        if self.clone_dir.exists() and any(self.clone_dir.iterdir()):
            raise SourceError(f"clone_dir {self.clone_dir} exists and is not empty; remove it or choose another")
        self.clone_dir.parent.mkdir(parents=True, exist_ok=True)
        run_git("clone", "--quiet", "--bare", "--single-branch", "--branch", self.branch, "--", self.config.url,
             str(self.clone_dir))

    def update(self) -> None:
        """Bring the branch up to date: a forced fetch for a remote, nothing for a local repository."""
        repo = self.fleet_repo
        if self.remote:
            run_git("fetch", "--quiet", "--prune", "--no-tags", "origin",
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

    def resolve(self, rev: str) -> str:
        """The full commit id of `rev` (a sha, a prefix, a tag...); SourceError when there is none."""
        return self.fleet_repo.resolve(rev)

    def in_history(self, revision: str, head: str) -> bool:
        """`revision` is `head` or one of its ancestors (the tracked branch's history)."""
        repo = self.fleet_repo.repo
        return revision == head or bool(repo.is_ancestor(repo.commit(revision), repo.commit(head)))


# -- commits fleetllm writes itself -------------------------------------------------------------------
def identity(name: str, email: str = "fleetllm@localhost") -> dict[str, str]:
    """Author and committer for the commits fleetllm writes."""
    return {"GIT_AUTHOR_NAME": name, "GIT_AUTHOR_EMAIL": email, "GIT_COMMITTER_NAME": name,
            "GIT_COMMITTER_EMAIL": email}


class RefMoved(SourceError):  # noqa: N818 (reads as what happened)
    """The branch was not where the commit expected it (compare-and-swap lost, or it already exists)."""


def _identity(git_dir: str, name: str) -> dict[str, str]:
    """The repository's configured identity, else `name` (a server often has none)."""
    try:
        run_git("config", "user.email", git_dir=git_dir)
    except SourceError:
        return {k: v for k, v in identity(name).items() if k not in os.environ}
    return {}


def commit_blob(git_dir: str, base: str, path: str, content: str, branch: str, message: str, *, create: bool,
                author: str = "fleetllm") -> str:
    """Commit `content` at `path` on top of `base` and point `branch` at it, without a working tree
    (a private index); compare-and-swap on the branch: RefMoved when it is not at `base` (or, with
    `create`, when it already exists)."""
    blob = run_git("hash-object", "-w", "--stdin", "--path", path, git_dir=git_dir, stdin=content).strip()
    with tempfile.TemporaryDirectory(prefix="fleetllm-commit-") as tmp:
        index = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        run_git("read-tree", base, git_dir=git_dir, env=index)
        run_git("update-index", "--add", "--cacheinfo", f"100644,{blob},{path}", git_dir=git_dir, env=index)
        tree = run_git("write-tree", git_dir=git_dir, env=index).strip()
    commit = run_git("commit-tree", tree, "-p", base, "-m", message, git_dir=git_dir,
                     env=_identity(git_dir, author)).strip()
    expected_old = "0" * len(base) if create else base
    try:
        run_git("update-ref", "-m", author, f"refs/heads/{branch}", commit, expected_old, git_dir=git_dir)
    except SourceError:
        what = "already exists; delete it or merge it first" if create else "moved meanwhile; try again"
        raise RefMoved(f"branch {branch} {what}") from None
    return commit


def commit_worktree_files(worktree: Path, files: Mapping[str, str], message: str,
                          base_env: Mapping[str, str] | None = None) -> str:
    """Write each of `files` (name: content) in a working tree, commit just those in one commit, and return the
    new HEAD."""
    for name, content in files.items():
        (worktree / name).write_text(content, encoding="utf-8")
    run_git("commit", "-q", "-m", message, "--", *files, cwd=worktree, base_env=base_env)
    return run_git("rev-parse", "HEAD", cwd=worktree, base_env=base_env).strip()


def commit_worktree_file(worktree: Path, name: str, content: str, message: str,
                         base_env: Mapping[str, str] | None = None) -> str:
    """Write `name` in a working tree, commit just that file, and return the new HEAD."""
    return commit_worktree_files(worktree, {name: content}, message, base_env)
