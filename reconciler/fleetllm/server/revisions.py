"""Which revision is served: the last valid commit of the tracked branch, rendered once per commit.

`refresh()` reads the branch head. A commit is validated and rendered the first time it is seen and
the outcome cached by SHA, so an invalid commit is logged (and counted) once, not once per request.
When the head is invalid, its first-parent history is walked back to the newest valid commit: that
keeps the previous revision after a bad push, and after a force-push it serves the newest valid
commit the branch now has. Nothing is ever rolled back by hand; the fix is a new commit.
A refresh that fails (fetch, unreadable object) keeps the served revision; it is counted every
time and logged once per distinct error, and once more when it clears.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from fleetllm.adapters.git import TrackedRepo
from fleetllm.adapters.notify import Notifier
from fleetllm.core.control import Pin
from fleetllm.core.fleet.history import MAX_WALK, newest_valid
from fleetllm.core.fleet.model import Fleet
from fleetllm.core.fleet.render import Bearers, RenderError, render_all
from fleetllm.core.fleet.validate import validate_snapshot
from fleetllm.errors import RequestError, SourceError
from fleetllm.logs import get_logger, log_event
from fleetllm.server.metrics import Metrics
from fleetllm.server.notifywatch import notify_head

CACHE_SIZE = 32  # commits whose outcome is remembered
MAX_ERRORS = 50  # diagnostics kept per invalid commit

log = get_logger("revisions")


@dataclass(frozen=True)
class RenderedBox:
    body: bytes
    etag: str


@dataclass(frozen=True)
class Rendered:
    """A valid commit with every box's JSON ready to send."""

    revision: str
    fleet: Fleet
    boxes: Mapping[str, RenderedBox]
    render_errors: Mapping[str, str]  # box -> why it cannot be rendered (server config, e.g. no legacy key)


@dataclass(frozen=True)
class Invalid:
    revision: str
    errors: tuple[str, ...]


@dataclass(frozen=True)
class Attempt:
    """The branch head as last examined (Flux's lastAttemptedRevision); the pages show it as it is."""

    revision: str
    valid: bool
    at: float = 0.0
    errors: tuple[str, ...] = ()


@dataclass(frozen=True)
class RefreshStatus:
    ok_at: float | None = None
    error: str | None = None
    error_at: float | None = None


@dataclass
class _State:
    served: Rendered | None = None
    applied_at: float | None = None
    attempted: Attempt | None = None
    refresh: RefreshStatus = field(default_factory=RefreshStatus)
    skipped: tuple[Invalid, ...] = ()  # invalid commits newer than the served one, head first
    pin: Pin | None = None  # an operator's pin (fleetllm pin): served instead of the newest valid commit
    pinned: Rendered | None = None  # the pinned revision, rendered


class PinError(RequestError):
    """A revision that cannot be pinned: unknown, outside the tracked branch's history, or invalid.
    `status` is the HTTP answer (404 unknown, 409 not pinnable); `errors` the validation errors."""

    def __init__(self, message: str, status: int, errors: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.status = status
        self.errors = errors


PIN_REV_CHARS = frozenset("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ._/~^-")


def rendered_box(document: Mapping[str, object]) -> RenderedBox:
    """A box JSON as it is sent: compact JSON and its ETag (a digest of the body)."""
    body = json.dumps(document, separators=(",", ":")).encode()
    return RenderedBox(body, '"' + hashlib.sha256(body).hexdigest()[:32] + '"')


def render_commit(fleet: Fleet, bearers: Bearers) -> Rendered:
    errors: dict[str, str] = {}
    documents = render_all(fleet, bearers, on_error=lambda box, exc: errors.__setitem__(box, str(exc)))
    boxes = {name: rendered_box(document) for name, document in documents.items()}
    return Rendered(fleet.revision, fleet, MappingProxyType(boxes), MappingProxyType(errors))


class RevisionTracker:
    def __init__(self, repo: TrackedRepo, bearers: Bearers, metrics: Metrics,
                 clock: Callable[[], float] = time.time, notifier: Notifier | None = None) -> None:
        self.repo = repo
        self.notifier = notifier  # invalid_commit notifications (server/notifywatch.py)
        self.bearers = bearers
        self.metrics = metrics
        self.clock = clock
        self._state = _State()
        self._cache: OrderedDict[str, Rendered | Invalid] = OrderedDict()
        self._lock = threading.Lock()  # single flight: git access is not thread-safe

    # Readers take one attribute each: the state object is replaced, never mutated in place.
    @property
    def git_lock(self) -> threading.Lock:
        """Held by refresh(); take it for any other use of the repository (approvals)."""
        return self._lock

    @property
    def served(self) -> Rendered | None:
        """What every box is served: the pinned revision while a pin is in force, else the newest
        valid commit (`chosen_revision`)."""
        state = self._state
        return state.pinned if state.pin is not None and state.pinned is not None else state.served

    @property
    def newest_valid(self) -> Rendered | None:
        """The newest valid commit of the branch, pinned or not."""
        return self._state.served

    @property
    def pin(self) -> Pin | None:
        return self._state.pin

    @property
    def applied_at(self) -> float | None:
        return self._state.applied_at

    @property
    def attempted(self) -> Attempt | None:
        return self._state.attempted

    @property
    def skipped(self) -> tuple[Invalid, ...]:
        """The invalid commits on the branch after the served one (first-parent line), head first."""
        return self._state.skipped

    @property
    def refresh_status(self) -> RefreshStatus:
        return self._state.refresh

    def refresh(self, *, log_failure: bool = True) -> bool:
        """Fetch and re-read the branch; returns True when the served revision changed. `log_failure=False`:
        the caller reports a failure itself (start-up raises it), so it is not logged here as well."""
        with self._lock:
            state = dataclasses.replace(self._state)
            try:
                self.repo.update()
                head = self.repo.head()
                changed = self._advance(state, head)
            except Exception as exc:  # whatever git or the repository throws: keep serving what we have
                message = str(exc) if isinstance(exc, SourceError) else f"{type(exc).__name__}: {exc}"
                if log_failure and message != state.refresh.error:  # told once while it persists; counted each time
                    log_event(log, "git refresh failed", logging.ERROR, repo=self.repo.where,
                              branch=self.repo.branch, error=message)
                state.refresh = RefreshStatus(state.refresh.ok_at, message, self.clock())
                self.metrics.refresh_errors.inc()
                self._state = state
                return False
            if state.refresh.error is not None:
                log_event(log, "git refresh recovered", repo=self.repo.where, branch=self.repo.branch,
                          last_error=state.refresh.error)
            state.refresh = RefreshStatus(self.clock())
            self.metrics.last_refresh.set(state.refresh.ok_at or 0)
            self._state = state
            return changed

    def pinnable(self, rev: str) -> Rendered:
        """The rendered commit `rev` names, if it may be pinned: a commit of the tracked branch's history
        (its head or an ancestor) that validates. PinError otherwise, saying why."""
        if not rev or len(rev) > 200 or rev.startswith("-") or not set(rev) <= PIN_REV_CHARS:
            raise PinError("give a commit of the tracked branch: a commit id (or a prefix of one), a tag or "
                             "branch~N", 400)
        with self._lock:
            try:
                self.repo.update()
                head = self.repo.head()
            except SourceError as exc:
                raise PinError(f"cannot read branch {self.repo.branch} of {self.repo.where}: {exc}", 409) from None
            try:
                sha = self.repo.resolve(rev)
            except Exception:  # SourceError, or whatever else git's revision parser throws at an odd name
                raise PinError(f"{rev}: no such commit in {self.repo.where}", 404) from None
            try:
                in_history = self.repo.in_history(sha, head)
            except Exception:  # git cannot walk from it: the null id, an object that is not there
                raise PinError(f"{rev}: no such commit in {self.repo.where}", 404) from None
            if not in_history:
                raise PinError(f"{sha[:12]} is not in the history of branch {self.repo.branch} (head "
                                 f"{head[:12]}): only a commit the branch has had can be pinned", 409)
            try:
                outcome = self._evaluate(sha)
            except SourceError as exc:
                raise PinError(f"{sha[:12]}: cannot read it: {exc}", 409) from None
        if isinstance(outcome, Invalid):
            raise PinError(f"{sha[:12]} is not a valid fleet revision ({len(outcome.errors)} error(s)); pin a "
                             "valid one", 409, outcome.errors)
        return outcome

    def set_pin(self, pin: Pin | None) -> bool:
        """Serve `pin`'s revision from now on (None: the newest valid commit again); True when what is
        served changed. A pin whose revision cannot be rendered is logged and not applied."""
        with self._lock:  # refresh() replaces the state too: one at a time
            if self._state.pin == pin:
                return False
            pinned: Rendered | None = None
            if pin is not None:
                try:
                    outcome = self._evaluate(pin.revision)
                except Exception as exc:  # git cannot read it: keep serving what we have, and say so
                    log_event(log, "pinned revision unreadable", logging.ERROR, revision=pin.revision,
                              error=f"{type(exc).__name__}: {exc}")
                    return False
                if not isinstance(outcome, Rendered):
                    log_event(log, "pinned revision invalid: not applied", logging.ERROR, revision=pin.revision)
                    return False
                pinned = outcome
            before = self.served
            state = dataclasses.replace(self._state, pin=pin, pinned=pinned)
            after = pinned if pinned is not None else state.served
            changed = (before.revision if before else None) != (after.revision if after else None)
            if changed and after is not None:
                state.applied_at = self.clock()
                self.metrics.serve_revision(after.revision, len(after.fleet.boxes), after.fleet.server_count)
            self._state = state
        if pin is not None:
            log_event(log, "serving pinned revision", logging.WARNING, revision=pin.revision, actor=pin.actor,
                      reason=pin.reason)
        else:
            log_event(log, "pin removed: serving the newest valid revision",
                      revision=after.revision if after else None)
        return changed

    def _advance(self, state: _State, head: str) -> bool:
        if state.attempted is not None and state.attempted.revision == head:
            return False
        skipped: list[Invalid] = []

        def valid_at(revision: str) -> Rendered | None:
            found = self._evaluate(revision)
            if isinstance(found, Invalid):
                skipped.append(found)
                return None
            return found

        known = {state.served.revision: state.served} if state.served is not None else {}
        valid = newest_valid(head, valid_at, self.repo.first_parent, known=known, max_walk=MAX_WALK).valid
        head_valid = valid is not None and valid.revision == head
        state.attempted = Attempt(head, head_valid, at=self.clock(), errors=() if head_valid else skipped[0].errors)
        if self.notifier is not None:
            notify_head(self.notifier, self.repo.branch, head, None if head_valid else state.attempted.errors,
                        state.served.revision if state.served is not None else None)
        self.metrics.last_attempted_valid.set(1 if head_valid else 0)
        state.skipped = tuple(skipped)
        if valid is None:
            if state.served is not None:
                log_event(log, f"no valid commit within {MAX_WALK} of the head; keeping the served revision",
                          logging.WARNING, revision=state.served.revision, branch=self.repo.branch, head=head)
            return False
        if state.served is not None and valid.revision == state.served.revision:
            return False
        state.served = valid
        if state.pin is not None:  # pinned: the new commit is noted, the pin is still what is served
            log_event(log, "newest valid revision (pinned: not served)", revision=valid.revision, head=head,
                      pinned=state.pin.revision)
            return False
        state.applied_at = self.clock()
        self.metrics.serve_revision(valid.revision, len(valid.fleet.boxes), valid.fleet.server_count)
        log_event(log, "serving revision", revision=valid.revision, head=head, boxes=len(valid.boxes),
                  servers=valid.fleet.server_count)
        return True

    def rendered_at(self, revision: str) -> Rendered | Invalid | None:
        """Any commit validated and rendered (cached by SHA): what a box released an older revision is
        served (staged rollouts). None when the commit cannot be read."""
        served = self._state.served
        if served is not None and served.revision == revision:
            return served
        with self._lock:
            try:
                return self._evaluate(revision)
            except Exception as exc:  # an unknown or unreadable commit: the caller refuses the request
                log_event(log, "released revision cannot be read", logging.ERROR, revision=revision,
                          error=str(exc) if isinstance(exc, SourceError) else type(exc).__name__)
                return None

    def cached_at(self, revision: str) -> Rendered | Invalid | None:
        """`rendered_at` for the event loop: never reads git nor waits on the tracker's lock; None when
        the commit has not been evaluated yet (or could not be read)."""
        served = self._state.served
        if served is not None and served.revision == revision:
            return served
        return self._cache.get(revision)  # one dict read: atomic under the GIL

    def _evaluate(self, revision: str) -> Rendered | Invalid:
        cached = self._cache.get(revision)
        if cached is not None:
            self._cache.move_to_end(revision)
            return cached
        validation = validate_snapshot(self.repo.snapshot(revision))
        outcome: Rendered | Invalid
        if validation.fleet is None:
            errors = tuple(d.text() for d in validation.errors[:MAX_ERRORS])
            outcome = Invalid(revision, errors)
            self.metrics.validation_failures.inc()
            log_event(log, "invalid commit not served", logging.ERROR, revision=revision, errors=list(errors))
        else:
            outcome = render_commit(validation.fleet, self.bearers)
            for box, why in outcome.render_errors.items():
                log_event(log, "box cannot be rendered", logging.ERROR, revision=revision, box=box, error=why)
        self._cache[revision] = outcome
        while len(self._cache) > CACHE_SIZE:
            self._cache.popitem(last=False)
        return outcome


__all__ = ["Attempt", "Invalid", "PinError", "RefreshStatus", "RenderError", "Rendered", "RenderedBox",
           "RevisionTracker"]
