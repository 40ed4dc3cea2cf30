"""Staged rollouts on the control plane's side (issue 14): which revision GET /vllm/config serves a box,
and the rollout as /health, the admin API and the pages show it.

A box is agent-managed when its rollout mode is auto at the served revision and its latest report says
`agent: true`: it is served the revision it is released (rendered from git by SHA, cached). Every other
box (manual, or auto without the agent) gets the newest valid commit, exactly as before.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field

from fleetllm.adapters.state.store import StateStore
from fleetllm.core.boxreport import BoxReport
from fleetllm.core.fleet.model import RolloutMode
from fleetllm.core.rollout.retire import Retirement, RetireState, retiring_document
from fleetllm.errors import StateError
from fleetllm.server.revisions import Rendered
from fleetllm.server.runtime import Runtime


@dataclass(frozen=True)
class Unservable:
    """The box is released a revision that cannot be rendered now: refuse, so it keeps what it runs."""

    revision: str
    why: str


def is_agent_report(report: BoxReport | None) -> bool:
    return report is not None and (report.agent or report.body.get("agent") is True)


CACHE_TTL_S = 1.0  # how old the releases a config request uses may be
REFRESH_AT = 0.5  # into its CACHE_TTL_S, a view is read again in the background (the event loop's requests)
RETRY_AFTER_S = 5.0  # after a failed read of the store, the last known releases are used this long
READ_WAIT_S = 0.5  # how long a request waits for another's read of the store before using the last view


@dataclass(frozen=True)
class ReleaseView:
    """What config requests need of the state store: each box's release, and the agent boxes' reported
    revisions. Read at most once a CACHE_TTL_S for all requests, so a box request never waits on the
    database, and kept while the database is unreachable (boxes are served all the same)."""

    releases: Mapping[str, str]
    agents: Mapping[str, str]  # agent box -> the revision its latest report names
    reported: Mapping[str, str] = field(default_factory=dict)  # every box -> its latest report's revision
    retirements: Mapping[str, Retirement] = field(default_factory=dict)  # boxes that left the placement


class ReleaseCache:
    """The ReleaseView, read at most once a CACHE_TTL_S. A request thread that finds it expired reads it,
    or waits for the read under way (`get`): no request is answered from a view older than CACHE_TTL_S
    unless the store is failing (a read that fails, or takes over READ_WAIT_S: the last view meanwhile).
    The event loop never reads: it starts a background read (`refresh`) once the view is REFRESH_AT into
    its lifetime, and answers from the view until it expires, so a busy loop keeps answering while the
    store is read instead of handing every request to a thread once a second."""

    def __init__(self, store: StateStore) -> None:
        self.store = store
        self.view: ReleaseView | None = None
        self.next_read = 0.0  # the view expires: older than CACHE_TTL_S (or the RETRY_AFTER_S of a failed read)
        self.refresh_at = 0.0  # a background read is due
        self.claimed = False  # the event loop has started a background read, not yet done
        self.lock = threading.Lock()

    def fresh(self) -> bool:
        """Whether `get` would answer without reading the store (the event loop asks before it does)."""
        return self.view is not None and time.monotonic() < self.next_read

    def claim_refresh(self) -> bool:
        """Whether the event loop should start a background read (`refresh`) now; True once per read due
        (the event loop's thread alone asks), until that read is done or finds it was not needed."""
        if self.claimed or time.monotonic() < self.refresh_at or self.lock.locked():
            return False
        self.claimed = True
        return True

    def get(self) -> ReleaseView | None:
        if time.monotonic() < self.next_read and self.view is not None:
            return self.view
        # A read under way is waited for: the view it leaves is new enough. Not for ever when there is a
        # view to answer with: a store that hangs must not hold every request thread (then the last view).
        if not self.lock.acquire(timeout=-1 if self.view is None else READ_WAIT_S):
            return self.view
        try:
            if time.monotonic() >= self.next_read or self.view is None:
                self._read()
            return self.view
        finally:
            self.lock.release()

    def refresh(self) -> None:
        """The event loop's background read, claimed by `claim_refresh`: read the view now, unless another
        read is under way or one began since the claim."""
        try:
            if self.lock.acquire(blocking=False):
                try:
                    if time.monotonic() >= self.refresh_at:
                        self._read()
                finally:
                    self.lock.release()
        finally:
            self.claimed = False

    def _read(self) -> None:
        """(the lock held) The view from the store; on a failure the last known one stays, RETRY_AFTER_S."""
        started = time.monotonic()
        try:
            releases = {b: r.revision for b, r in self.store.box_releases().items()}
            latest = self.store.latest_reports()
            agents = {b: r.revision for b, r in latest.items() if is_agent_report(r)}
            self.view = ReleaseView(releases, agents, {b: r.revision for b, r in latest.items()},
                                    self.store.retirements())
            self.next_read = started + CACHE_TTL_S  # its age counts from when the read began
            self.refresh_at = started + CACHE_TTL_S * REFRESH_AT
        except StateError:
            self.next_read = self.refresh_at = time.monotonic() + RETRY_AFTER_S  # keep serving the last known view


_CACHES: weakref.WeakKeyDictionary[StateStore, ReleaseCache] = weakref.WeakKeyDictionary()  # by store
_CACHES_LOCK = threading.Lock()


def release_cache(rt: Runtime) -> ReleaseCache:
    cache = _CACHES.get(rt.store)
    if cache is not None:  # every request after the first: no lock
        return cache
    with _CACHES_LOCK:
        cache = _CACHES.get(rt.store)
        if cache is None:
            cache = _CACHES[rt.store] = ReleaseCache(rt.store)
        return cache


def served_for(rt: Runtime, served: Rendered, box: str, *, wait: bool = True) -> Rendered | Unservable | None:
    """The rendering GET /vllm/config answers `box` with. `wait` False (the event loop): None instead of
    reading the state store or git, when the answer needs either (the caller hands the request to a
    thread, which calls this again with `wait`)."""
    if served.fleet.rollout_mode(box) is not RolloutMode.AUTO:
        return served
    cache = release_cache(rt)
    if not wait and not cache.fresh():
        return None
    view = cache.get()
    if view is None or box not in view.agents:
        return served  # nothing known (the store never answered), or no agent: the head, as before
    release = view.releases.get(box)
    # No release yet (the reconciler has not run since the agent appeared): the box keeps what it runs, so
    # a commit merged meanwhile still goes through the rollout. A box placed only later gets the head.
    revision = release if release is not None else view.agents[box]
    if revision == served.revision or not revision:
        return served
    found = rt.tracker.rendered_at(revision) if wait else rt.tracker.cached_at(revision)
    if found is None and not wait:
        return None
    if release is None and (not isinstance(found, Rendered) or box not in found.fleet.boxes):
        return served
    if not isinstance(found, Rendered):
        return Unservable(revision, "it cannot be read from the repository" if found is None else "it is not valid")
    if box not in found.boxes:
        return Unservable(revision, "the box is not in its placement or cannot be rendered")
    return found


@dataclass(frozen=True)
class Leaving:
    """A box the served revision does not place but the control plane knows (it left the placement): what
    GET /vllm/config and POST /vllm/report answer it (core.rollout.retire)."""

    box: str
    state: RetireState
    revision: str  # the commit at which it left (its retiring JSON's revision); "" before a pass noted it
    kept: Rendered | None = None  # draining: the revision it runs, rendered (None: none can be served)
    record: Retirement | None = None

    def document(self, report_key: str) -> dict[str, object]:
        return dict(retiring_document(self.box, self.revision, report_key))


def leaving(rt: Runtime, box: str) -> Leaving | None:
    """How a box the served revision does not place leaves (None: the control plane never knew it: an
    unknown box). A retiring one is served a box JSON with no servers, a retired one a 404; before that,
    while its deployments leave LiteLLM, it is served what it runs."""
    view = release_cache(rt).get()
    if view is None:
        return None
    record = view.retirements.get(box)
    if record is not None and record.state is not RetireState.DRAINING:
        return Leaving(box, record.state, record.revision, record=record)
    candidates = [view.releases.get(box), record.kept_revision if record is not None else None,
                  view.reported.get(box)]
    if record is None and not any(candidates):
        return None
    for revision in dict.fromkeys(r for r in candidates if r):  # the first that places it: what it runs
        found = rt.tracker.rendered_at(revision)
        if isinstance(found, Rendered) and box in found.boxes:
            return Leaving(box, RetireState.DRAINING, record.revision if record else "", found, record)
    return Leaving(box, RetireState.DRAINING, record.revision if record else "", None, record)


def rollout_status(rt: Runtime) -> dict[str, object] | None:
    """The rollout for /health and the admin API: target, state, waves, each box's release."""
    rollout, request, actor = rt.store.current_rollout()
    if rollout is None:
        return None
    releases = rt.store.box_releases()
    reports = rt.store.latest_reports()
    return {
        "retirements": {box: retirement_json(r) for box, r in sorted(rt.store.retirements().items())},
        "target": rollout.target, "state": str(rollout.state), "reason": rollout.reason, "waves": rollout.waves,
        "started_at": rollout.started_at, "updated_at": rollout.updated_at,
        "requested": None if request is None else {"request": str(request), "by": actor},
        "boxes": {box: {"state": str(r.state), "released": r.revision, "last_good": r.last_good,
                        "applied": reports[box].revision if box in reports else None, "wave": r.wave,
                        "released_at": r.released_at, "why": r.reason}
                  for box, r in sorted(releases.items())},
    }


def retirement_json(record: Retirement) -> dict[str, object]:
    return {"state": str(record.state), "revision": record.revision, "left_at": record.left_at,
            "retiring_at": record.retiring_at, "retired_at": record.retired_at, "reason": record.reason}


def rollout_summary(rt: Runtime) -> dict[str, object] | None:
    """The rollout for the public /health: its state and why, and boxes counted by state (the boxes
    themselves are listed only to a token holder: GET /admin/rollout, the pages)."""
    status = rollout_status(rt)
    if status is None:
        return None
    boxes = status.pop("boxes")
    assert isinstance(boxes, dict)
    status.pop("requested", None)
    status.pop("retirements", None)
    counts: dict[str, int] = {}
    for release in boxes.values():
        counts[release["state"]] = counts.get(release["state"], 0) + 1
    return {**status, "boxes": counts}
