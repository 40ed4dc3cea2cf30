"""Approving a box is a git change: add it to placement.yaml and commit, never a database edit.

`approve` validates the whole fleet with the edit applied (fleetllm.core.fleet.approve.add_box) and
commits it with git plumbing (a private index, no checkout), on a new branch `approve/<host>` ready for a
pull request, or on the tracked branch when asked to. `fleetllm approve` and the admin API's
POST /admin/approve both run it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from fleetllm.adapters.git import GitFleetRepo, commit_blob
from fleetllm.core.fleet.approve import ApproveError, Row, add_box, assign_rows, ref_name
from fleetllm.core.fleet.diagnostics import format_text
from fleetllm.core.fleet.files import PLACEMENT_FILE, Snapshot
from fleetllm.core.fleet.model import Provider
from fleetllm.core.fleet.validate import validate_snapshot
from fleetllm.errors import SourceError
from fleetllm_contract.addresses import canonical_address

__all__ = ["ApproveError", "Approved", "approve", "commit_file", "open_repo"]


@dataclass(frozen=True)
class Approved:
    host: str
    rows: tuple[Row, ...]
    branch: str
    commit: str
    base: str


def commit_file(repo: GitFleetRepo, base: str, path: str, content: str, branch: str, message: str,
                *, create: bool) -> str:
    """Commit `content` at `path` on top of `base` and point `branch` at it (compare-and-swap)."""
    try:
        return commit_blob(str(repo.repo.git_dir), base, path, content, branch, message, create=create,
                           author="fleetllm approve")
    except SourceError as exc:
        raise ApproveError(str(exc)) from None


def _checked_out(repo: GitFleetRepo, branch: str) -> bool:
    if repo.repo.bare:
        return False
    try:
        return bool(repo.repo.head.is_valid() and repo.repo.head.ref.name == branch)
    except TypeError:  # detached HEAD
        return False


def open_repo(path: str | os.PathLike[str]) -> GitFleetRepo:
    try:
        return GitFleetRepo(path)
    except SourceError as exc:
        raise ApproveError(str(exc)) from None


def approve(repo: GitFleetRepo, host: str, models: Sequence[str], *, base_branch: str | None = None,
            onto_tracked: bool = False, note: str | None = None, provider: Provider | None = None) -> Approved:
    """Add `host` with `models` to the placement at the head of `base_branch` (default: HEAD) and commit."""
    host = canonical_address(host)
    try:
        base = repo.resolve(f"refs/heads/{base_branch}" if base_branch else "HEAD")
        snapshot = repo.snapshot(base)
    except SourceError as exc:
        raise ApproveError(str(exc)) from None
    current = validate_snapshot(snapshot)
    if current.fleet is None:
        raise ApproveError(f"the fleet at {base[:12]} is not valid; fix it first:\n{format_text(current.errors)}")
    placement = snapshot.files.get(PLACEMENT_FILE)
    if not isinstance(placement, bytes):
        raise ApproveError(f"{PLACEMENT_FILE} cannot be read at {base[:12]}")
    rows = assign_rows(current.fleet, host, models)
    text = add_box(placement.decode("utf-8"), host, rows, note, provider)
    edited = Snapshot(base, {**snapshot.files, PLACEMENT_FILE: text.encode()}, snapshot.display)
    result = validate_snapshot(edited)
    if result.fleet is None:
        raise ApproveError(f"the placement with {host} added is not valid:\n{format_text(result.errors)}")
    if onto_tracked:
        if not base_branch:
            raise ApproveError("committing onto the tracked branch needs its name")
        if _checked_out(repo, base_branch):
            raise ApproveError(f"branch {base_branch} is checked out in {repo.repo.working_tree_dir}; committing "
                               "under a working tree would leave it stale. Use a bare repository for the control "
                               "plane, or approvals on new branches (approve.target: branch)")
        branch = base_branch
    else:
        branch = ref_name(host)
    path = PLACEMENT_FILE if str(repo.subdir) in ("", ".") else f"{repo.subdir}/{PLACEMENT_FILE}"
    ports = ", ".join(f"{r.name}:{r.port}" for r in rows)
    where = f" ({provider.value})" if provider is not None else ""
    message = f"Approve box {host}{where}: {', '.join(models)}\n\nAdded by fleetllm approve. Servers: {ports}.\n"
    commit = commit_file(repo, base, path, text, branch, message, create=not onto_tracked)
    return Approved(host, rows, branch, commit, base)
