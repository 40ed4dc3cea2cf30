"""Staged rollouts on the control plane's side (issue 14): which revision GET /vllm/config serves a box,
and the rollout as /health, the admin API and the pages show it.

A box is agent-managed when its rollout mode is auto at the served revision and its latest report says
`agent: true`: it is served the revision it is released (rendered from git by SHA, cached). Every other
box (manual, or auto without the agent) gets the newest valid commit, exactly as before.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmfleet.adapters.state.records import BoxReport
from llmfleet.core.fleet.model import RolloutMode
from llmfleet.server.revisions import Rendered
from llmfleet.server.runtime import Runtime


@dataclass(frozen=True)
class Unservable:
    """The box is released a revision that cannot be rendered now: refuse, so it keeps what it runs."""

    revision: str
    why: str


def is_agent_report(report: BoxReport | None) -> bool:
    return report is not None and (report.agent or report.body.get("agent") is True)


def served_for(rt: Runtime, served: Rendered, box: str) -> Rendered | Unservable:
    """The rendering GET /vllm/config answers `box` with."""
    if served.fleet.rollout_mode(box) is not RolloutMode.AUTO:
        return served
    release = rt.store.box_release(box)
    report = rt.store.latest_report(box)
    if report is None or not is_agent_report(report):
        return served
    # No release yet (the reconciler has not run since the agent appeared): the box keeps what it runs, so
    # a commit merged meanwhile still goes through the rollout. A box placed only later gets the head.
    revision = release.revision if release is not None else report.revision
    if revision == served.revision or not revision:
        return served
    found = rt.tracker.rendered_at(revision)
    if release is None and (not isinstance(found, Rendered) or box not in found.fleet.boxes):
        return served
    if not isinstance(found, Rendered):
        return Unservable(revision, "it cannot be read from the repository" if found is None else "it is not valid")
    if box not in found.boxes:
        return Unservable(revision, "the box is not in its placement or cannot be rendered")
    return found


def rollout_status(rt: Runtime) -> dict[str, object] | None:
    """The rollout for /health and the admin API: target, state, waves, each box's release."""
    rollout, request, actor = rt.store.current_rollout()
    if rollout is None:
        return None
    releases = rt.store.box_releases()
    reports = rt.store.latest_reports()
    return {
        "target": rollout.target, "state": str(rollout.state), "reason": rollout.reason, "waves": rollout.waves,
        "started_at": rollout.started_at, "updated_at": rollout.updated_at,
        "requested": None if request is None else {"request": str(request), "by": actor},
        "boxes": {box: {"state": str(r.state), "released": r.revision, "last_good": r.last_good,
                        "applied": reports[box].revision if box in reports else None, "wave": r.wave,
                        "released_at": r.released_at, "why": r.reason}
                  for box, r in sorted(releases.items())},
    }


def rollout_summary(rt: Runtime) -> dict[str, object] | None:
    """The rollout for the public /health: its state and why, and boxes counted by state (the boxes
    themselves are listed only to a token holder: GET /admin/rollout, the pages)."""
    status = rollout_status(rt)
    if status is None:
        return None
    boxes = status.pop("boxes")
    assert isinstance(boxes, dict)
    status.pop("requested", None)
    counts: dict[str, int] = {}
    for release in boxes.values():
        counts[release["state"]] = counts.get(release["state"], 0) + 1
    return {**status, "boxes": counts}
