"""The revision view (what is served, what was last attempted, how to see the difference) and the
history of reconcile passes. Pure."""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from fleetllm.adapters.state.passes import ActionRecord, PassRecord
from fleetllm.server.pages.fleetview import ordered
from fleetllm.server.pages.inputs import Inputs
from fleetllm.server.revisions import Attempt

_SCP_LIKE = re.compile(r"^(?:[^@/\s]+@)?(?P<host>[A-Za-z0-9.-]+):(?!//)(?P<path>[^\s]+)$")


def web_url(repo_url: str | None) -> str | None:
    """The browsable https URL of a git remote (`git@host:o/r.git`, `ssh://`, `https://user:tok@host/o/r.git`),
    credentials removed; None for anything else (a local path, file://)."""
    if not repo_url:
        return None
    text = repo_url.strip()
    scp = _SCP_LIKE.match(text) if "://" not in text else None
    if scp is not None:
        scheme, host, path = "https", scp["host"], scp["path"]
    else:
        parts = urlsplit(text)
        if parts.scheme not in ("https", "http", "ssh", "git", "git+ssh") or not parts.hostname:
            return None
        scheme = parts.scheme if parts.scheme in ("https", "http") else "https"
        try:
            port = parts.port if parts.scheme in ("https", "http") else None
        except ValueError:
            return None
        host = parts.hostname + (f":{port}" if port else "")
        path = parts.path
    path = path.strip("/").removesuffix(".git").strip("/")
    if not path or not re.fullmatch(r"[A-Za-z0-9._~/-]+", path):
        return None
    return f"{scheme}://{host}/{path}"


def _gitlab(web: str) -> bool:
    return "gitlab" in (urlsplit(web).hostname or "")


def compare_url(web: str, base: str, head: str) -> str:
    return f"{web}/-/compare/{base}...{head}" if _gitlab(web) else f"{web}/compare/{base}...{head}"


def commit_url(web: str, revision: str) -> str:
    return f"{web}/-/commit/{revision}" if _gitlab(web) else f"{web}/commit/{revision}"


@dataclass(frozen=True)
class Link:
    label: str
    url: str


@dataclass(frozen=True)
class Diff:
    what: str
    command: str
    link: str | None


@dataclass(frozen=True)
class RevisionView:
    generated_at: float
    repository: str
    branch: str
    served: str | None
    served_since: float | None
    attempted: Attempt | None  # the branch head as last examined
    last_refresh_ok_at: float | None
    refresh_error: str | None
    pass_revision: str | None  # the revision the last reconcile pass worked from
    diffs: tuple[Diff, ...]
    links: tuple[Link, ...]


def _diff(what: str, base: str, head: str, repo_dir: str, web: str | None) -> Diff:
    return Diff(what, f"fleetllm diff {base} {head} --repo {shlex.quote(repo_dir)}",
                compare_url(web, base, head) if web else None)


def revision_view(inputs: Inputs) -> RevisionView:
    settings = inputs.settings
    web = web_url(settings.repo_url)
    served = inputs.served.revision if inputs.served is not None else None
    attempted = inputs.attempted
    last = inputs.last_pass
    diffs = []
    if served and attempted is not None and attempted.revision != served:
        diffs.append(_diff("the branch head (not served) against the served revision", served, attempted.revision,
                           settings.repo_dir, web))
    if served and last is not None and last.revision != served:
        diffs.append(_diff("the served revision against the one the last reconcile pass used", last.revision, served,
                           settings.repo_dir, web))
    links = [Link(f"commit {rev[:12]}", commit_url(web, rev)) for rev in
             dict.fromkeys(r for r in (served, attempted.revision if attempted else None) if r)] if web else []
    return RevisionView(
        generated_at=inputs.now, repository=settings.repo_where, branch=settings.branch, served=served,
        served_since=inputs.applied_at,
        attempted=attempted,
        last_refresh_ok_at=inputs.refresh.ok_at, refresh_error=inputs.refresh.error,
        pass_revision=last.revision if last else None, diffs=tuple(diffs), links=tuple(links))


@dataclass(frozen=True)
class PassView:
    started_at: float
    duration_s: float
    revision: str
    mode: str
    ok: bool
    verdicts: Mapping[str, int]
    actions: tuple[ActionRecord, ...]
    errors: tuple[str, ...]
    blocked: tuple[str, ...]
    held: int
    drift: int


@dataclass(frozen=True)
class HistoryView:
    generated_at: float
    passes: tuple[PassView, ...]


def pass_view(record: PassRecord) -> PassView:
    return PassView(record.started_at, record.duration_s, record.revision, record.mode, record.ok,
                    ordered(record.verdicts), record.actions, record.errors, record.blocked,
                    record.held, record.drift)


def history_view(inputs: Inputs) -> HistoryView:
    return HistoryView(inputs.now, tuple(pass_view(p) for p in inputs.passes))
