"""Where a pass reads its fleet: a repository named by the caller (`--repo DIR`) at a revision, else the
config's repository (repo.path, or repo.url fetched first into the reconciler's own bare clone, the way
the control plane keeps its own) at its tracked branch.

`tracked()` is what the reconcile job reads before each pass: the tracked branch's newest valid commit,
walked back the way the control plane does (fleetllm.core.fleet.history.newest_valid), so an invalid
head never stops reconciling; the head is reported (`InvalidHead`) until a fix or a revert is pushed.
Words for a person (the fleet's diagnostics, the invalid head) go to `say`: the CLI prints them on stderr.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace

from fleetllm.adapters.git import GitFleetRepo, TrackedRepo, is_bare_repository, read_fleet
from fleetllm.core.fleet.diagnostics import format_text
from fleetllm.core.fleet.files import Snapshot
from fleetllm.core.fleet.history import newest_valid
from fleetllm.core.fleet.model import Fleet
from fleetllm.core.fleet.validate import Validation, validate_snapshot
from fleetllm.errors import EXIT_INVALID, OperationError, SourceError
from fleetllm.job.configfile import JobConfig
from fleetllm.job.loop import LOG
from fleetllm.logs import log_event

Say = Callable[[str], None]  # a line for the person running the pass (the CLI: stderr)


class InvalidFleetError(OperationError):
    """The fleet read is not valid (and, on a tracked branch, no valid commit is behind it): nothing is
    planned or applied."""

    exit_code = EXIT_INVALID


@dataclass(frozen=True)
class InvalidHead:
    """The tracked branch's head is not valid: passes run on `serving`, the newest valid commit behind it."""

    revision: str
    errors: tuple[str, ...]
    serving: str


@dataclass(frozen=True)
class FleetSource:
    """`repo` (a directory or a bare repository named by the caller) at `rev`; without `repo`, the config's
    repository at `rev`, else at its tracked branch."""

    config: JobConfig
    repo: str | None = None
    rev: str | None = None

    def at(self, rev: str) -> FleetSource:
        return replace(self, rev=rev)

    @property
    def remote(self) -> bool:
        """The config's repo.url, fetched into the reconciler's own clone (a given `repo` wins)."""
        return self.config.remote_repo is not None and not self.repo

    def where(self) -> tuple[str, str | None]:
        """The repository and the revision read: `repo` at `rev` as given (`rev` None: its working tree,
        or a bare one's HEAD); else the config's repository at `rev` or its tracked branch."""
        if self.repo:
            return self.repo, self.rev
        return self.config.repo_path or ".", self.rev or self.config.branch

    def _tracked_repo(self) -> TrackedRepo:
        assert self.config.remote_repo is not None
        assert self.config.clone_dir is not None
        return TrackedRepo(self.config.remote_repo, self.config.clone_dir)

    def _fetch(self) -> Validation:
        tracked = self._tracked_repo()
        try:
            tracked.update()
            return validate_snapshot(tracked.snapshot(self.rev or tracked.head()))
        except SourceError as exc:
            raise SourceError(f"{tracked.where}: {exc}") from None
        finally:
            tracked.close()

    def load(self, say: Say) -> Fleet:
        """The fleet where() names, as it is (no walk back): InvalidFleetError when it is not valid."""
        validation = self._fetch() if self.remote else validate_snapshot(read_fleet(*self.where()))
        if validation.diagnostics:  # errors, or warnings such as a deprecated public port
            say(format_text(validation.diagnostics))
        if validation.fleet is None:
            raise InvalidFleetError(f"the fleet at {validation.revision} is not valid: nothing is planned or applied; "
                                    "fix it (fleetllm validate) or revert the commit")
        return validation.fleet

    def tracked(self, say: Say, command: str) -> tuple[Fleet, InvalidHead | None]:
        """The fleet at the tracked branch's newest valid commit, and the head when it is not that commit.
        An explicit `rev`, or a working tree (`repo` without `rev`), is read as it is: nothing to walk.
        `command` names the command in what is said."""
        repo, rev = self.where()
        if self.rev is not None or not (self.remote or rev or is_bare_repository(self.repo or "")):
            return self.load(say), None
        tracked: TrackedRepo | None = None
        snapshot: Callable[[str], Snapshot]
        first_parent: Callable[[str], str | None]
        validations: dict[str, Validation] = {}
        where = repo
        try:
            if self.remote:
                tracked = self._tracked_repo()
                where = tracked.where
                tracked.update()
                head = tracked.head()
                snapshot, first_parent = tracked.snapshot, tracked.first_parent
            else:
                local = GitFleetRepo(repo)
                head = local.resolve(rev or "HEAD")
                snapshot, first_parent = local.snapshot, local.first_parent

            def valid_at(revision: str) -> Fleet | None:
                validations[revision] = validate_snapshot(snapshot(revision))
                return validations[revision].fleet

            walk = newest_valid(head, valid_at, first_parent)
        except SourceError as exc:
            raise SourceError(f"{where}: {exc}") from None
        finally:
            if tracked is not None:
                tracked.close()
        validation = validations.get(head)
        if validation is not None and validation.diagnostics:  # errors, or warnings such as a deprecated port
            say(format_text(validation.diagnostics))
        if walk.valid is None:
            raise InvalidFleetError(f"the fleet at {head} is not valid and no valid commit was found behind it: "
                                    "nothing is planned or applied; fix it (fleetllm validate) or revert the commit")
        if walk.valid.revision == head or validation is None:
            return walk.valid, None
        errors = tuple(d.text() for d in validation.errors[:50])
        invalid = InvalidHead(head, errors, walk.valid.revision)
        say(f"fleetllm {command}: the branch head {head[:12]} is not valid ({len(errors)} error(s), above); this "
            f"pass runs on the last valid commit {invalid.serving[:12]}: push a fix or a revert")
        log_event(LOG, "fleet_invalid", logging.WARNING, head=head, keeping=invalid.serving, errors=list(errors))
        return walk.valid, invalid

    def fleet_at(self, revision: str) -> Fleet | None:
        """The valid fleet at a commit (a box's released revision), read from git objects; None when it
        cannot be read or is not valid."""
        try:
            if self.remote:
                tracked = self._tracked_repo()
                try:
                    return validate_snapshot(tracked.snapshot(revision)).fleet
                finally:
                    tracked.close()
            return validate_snapshot(read_fleet(self.where()[0], revision)).fleet
        except SourceError:
            return None
