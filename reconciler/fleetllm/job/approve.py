"""Approving a box is a git change: add it to placement.yaml and commit, never a database edit.

`add_box` is the pure part: a round-trip YAML edit (ruamel.yaml) that keeps every comment and every
other line as written, with free listen ports assigned. `approve` validates the whole fleet with the
edit applied and commits it with git plumbing (a private index, no checkout), on a new branch
`approve/<host>` ready for a pull request, or on the tracked branch when asked to.
"""

from __future__ import annotations

import io
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import YAMLError

from fleetllm.adapters.git import GitFleetRepo, commit_blob
from fleetllm.core.fleet.diagnostics import format_text
from fleetllm.core.fleet.files import PLACEMENT_FILE, Snapshot
from fleetllm.core.fleet.model import Fleet, Provider
from fleetllm.core.fleet.validate import validate_snapshot
from fleetllm.errors import OperationError, SourceError
from fleetllm_contract.addresses import canonical_address

_INDENTS = [(m, s, o) for m in (2, 4) for s in (2, 4, 6) for o in (0, 2, 4) if o <= s - 2]


class ApproveError(OperationError):
    """The approval cannot be made; the message says why and what to do."""


@dataclass(frozen=True)
class Row:
    model: str
    port: int
    name: str

    def yaml(self) -> list[str | int]:
        return [self.model, self.port] if self.name == self.model else [self.model, self.port, self.name]


@dataclass(frozen=True)
class Approved:
    host: str
    rows: tuple[Row, ...]
    branch: str
    commit: str
    base: str


def assign_rows(fleet: Fleet, host: str, models: Sequence[str]) -> tuple[Row, ...]:
    """One row per model on the first free listen ports; a repeated model gets a numbered name."""
    if not models:
        raise ApproveError("name at least one model to run on the box")
    unknown = sorted({m for m in models if m not in fleet.recipes})
    if unknown:
        raise ApproveError(f"unknown model{'s' * (len(unknown) > 1)} {', '.join(unknown)}; the catalog has "
                           f"{', '.join(sorted(fleet.recipes))}")
    if host in fleet.boxes:
        raise ApproveError(f"box {host} is already in the placement; edit {PLACEMENT_FILE} to change its servers")
    limit = min(len(fleet.settings.listen_ports), fleet.settings.max_servers_per_box)
    if len(models) > limit:
        raise ApproveError(f"{len(models)} models, but a box runs at most {limit} servers "
                           f"(listen ports {', '.join(map(str, fleet.settings.listen_ports))})")
    rows: list[Row] = []
    for model, port in zip(models, fleet.settings.listen_ports, strict=False):
        seen = sum(1 for r in rows if r.model == model)
        rows.append(Row(model, port, model if seen == 0 else f"{model}-{seen + 1}"))
    return tuple(rows)


def _yaml(mapping: int, sequence: int, offset: int) -> YAML:
    yaml = YAML()
    yaml.preserve_quotes = True
    yaml.width = 4096
    yaml.indent(mapping=mapping, sequence=sequence, offset=offset)
    return yaml


def _round_trip(text: str) -> tuple[YAML, CommentedMap]:
    """The loader whose output reproduces `text` byte for byte (so the edit changes nothing else)."""
    for indent in _INDENTS:
        yaml = _yaml(*indent)
        try:
            data = yaml.load(text)
        except YAMLError as exc:
            raise ApproveError(f"{PLACEMENT_FILE} is not valid YAML: {exc}") from None
        out = io.StringIO()
        yaml.dump(data, out)
        if out.getvalue() == text:
            if not isinstance(data, CommentedMap) or not isinstance(data.get("hosts"), CommentedMap):
                raise ApproveError(f"{PLACEMENT_FILE} has no `hosts:` mapping to add the box to")
            return yaml, data
    raise ApproveError(f"cannot edit {PLACEMENT_FILE} without reformatting it (unusual indentation); add the box "
                       "by hand")


def add_box(placement: str, host: str, rows: Sequence[Row], note: str | None = None,
            provider: Provider | None = None) -> str:
    """placement.yaml's text with the box appended under `hosts:`, everything else unchanged. With a
    provider the box takes the detailed form (`provider:` and `servers:`), else the short row list."""
    yaml, data = _round_trip(placement)
    hosts: CommentedMap = data["hosts"]
    servers = CommentedSeq()
    for row in rows:
        item = CommentedSeq(row.yaml())
        item.fa.set_flow_style()
        servers.append(item)
    if provider is None:
        hosts[host] = servers
    else:
        box = CommentedMap()
        box["provider"] = provider.value
        box["servers"] = servers
        hosts[host] = box
    if note and not hosts.fa.flow_style():
        column = hosts.lc.key(next(iter(hosts)))[1] if len(hosts) > 1 else 2
        blank = "\n" if len(hosts) > 1 else ""
        hosts.yaml_set_comment_before_after_key(host, before=blank + note.replace("\n", " "), indent=column)
    out = io.StringIO()
    yaml.dump(data, out)
    return out.getvalue()


def ref_name(host: str) -> str:
    """`approve/<host>` with the characters git forbids in ref names (IPv6 colons) replaced."""
    return "approve/" + re.sub(r"[^A-Za-z0-9._-]", "-", host).strip(".-")


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
