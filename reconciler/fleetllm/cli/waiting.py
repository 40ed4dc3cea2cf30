"""Waiting for a revision's rollout (`fleetllm rollout wait [REVISION]`, `fleetllm sync --wait`): poll the
admin API's rollout view (GET /admin/rollout) until the rollout of the revision ends, printing a line
each time what it says changes. Usable in CI after a merge:

    0  the rollout converged (every agent-managed box runs the revision)
    1  it halted (a released box failed and was rolled back), was aborted, or a newer revision
       superseded it before it finished
    2  it did not end within the timeout (or the control plane could not be asked: a usage error, a
       refused token, no answer until the timeout)

`judge` is pure: what one view of the rollouts says about the revision waited for.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from fleetllm.adapters.admin_client import AdminApiError, AdminClient, AdminRefused
from fleetllm.cli.common import EXIT_OK, CommandError
from fleetllm.errors import EXIT_INVALID, EXIT_USAGE

EXIT_CONVERGED, EXIT_FAILED, EXIT_TIMEOUT = EXIT_OK, EXIT_INVALID, EXIT_USAGE
DEFAULT_TIMEOUT_S = 1800.0
DEFAULT_INTERVAL_S = 5.0
MIN_INTERVAL_S = 0.2
REQUEST_TIMEOUT_S = 15.0
REVISION = re.compile(r"[0-9a-f]{4,40}")
ORDER = ("applied", "released", "draining", "waiting", "halted")  # box states, in the order a line shows them


@dataclass(frozen=True)
class Judged:
    """What a view says: `code` None while the rollout of `target` goes on; `line` what to print."""

    code: int | None
    line: str
    target: str | None = None  # the revision waited for, in full, once a rollout of it is seen


def revision_argument(text: str, what: str) -> str:
    """A commit id (or a prefix of at least 4 hex digits), lower case; else a usage error naming `what`."""
    revision = text.strip().lower()
    if not REVISION.fullmatch(revision):
        raise CommandError(f"{what} {text!r} is not a commit id: give the SHA (at least 4 hex digits) of a commit "
                           "of the tracked branch, e.g. $GITHUB_SHA")
    return revision


def boxes_text(boxes: Mapping[str, Any]) -> str:
    counts: dict[str, int] = {}
    for release in boxes.values():
        state = str(release.get("state", "?")) if isinstance(release, Mapping) else "?"
        counts[state] = counts.get(state, 0) + 1
    ordered = sorted(counts, key=lambda s: (ORDER.index(s) if s in ORDER else len(ORDER), s))
    return ", ".join(f"{counts[s]} {s}" for s in ordered) or "no agent-managed box"


def _progress(rollout: Mapping[str, Any]) -> str:
    boxes = rollout.get("boxes")
    line = (f"rollout of {str(rollout['target'])[:12]}: {rollout['state']}, {rollout.get('waves', 0)} wave(s); "
            f"boxes: {boxes_text(boxes if isinstance(boxes, Mapping) else {})}")
    reason = rollout.get("reason")
    return f"{line} ({reason})" if reason else line


def judge(view: Mapping[str, Any], wanted: str | None) -> Judged:
    """What the admin API's rollout view says about the rollout of `wanted` (a commit id or a prefix;
    None: the current rollout's target)."""
    current = view.get("rollout")
    current = current if isinstance(current, Mapping) else None
    if wanted is None:
        if current is None:
            return Judged(None, "no rollout yet: waiting for the reconciler's first pass that writes")
        wanted = str(current["target"])
    if current is not None and str(current["target"]).startswith(wanted):
        target, state = str(current["target"]), str(current["state"])
        if state == "converged":
            return Judged(EXIT_CONVERGED, f"converged: every agent-managed box runs {target[:12]}", target)
        if state in ("halted", "aborted"):
            why = f": {current['reason']}" if current.get("reason") else ""
            return Judged(EXIT_FAILED, f"{state}{why}", target)
        return Judged(None, _progress(current), target)
    history = view.get("history") or []
    past = next((r for r in history if isinstance(r, Mapping) and str(r.get("target", "")).startswith(wanted)), None)
    newest = f"the newest is {str(current['target'])[:12]}, {current['state']}" if current else "there is none yet"
    if past is None:
        return Judged(None, f"the rollout of {wanted[:12]} has not started ({newest}): the reconciler starts it once "
                            "it reads the commit (a sync, a push webhook, or its next interval)")
    target, state = str(past["target"]), str(past["state"])
    if state == "converged":
        return Judged(EXIT_CONVERGED, f"converged: every agent-managed box ran {target[:12]} ({newest})", target)
    if state in ("halted", "aborted"):
        why = f": {past['reason']}" if past.get("reason") else ""
        return Judged(EXIT_FAILED, f"{state}{why}", target)
    return Judged(EXIT_FAILED, f"superseded: a newer revision's rollout started before {target[:12]}'s finished "
                               f"({newest}); wait for that one instead", target)


def wait_for_rollout(client: AdminClient, revision: str | None, *, timeout_s: float, interval_s: float,
                     say: Callable[[str], None], clock: Callable[[], float] = time.monotonic,
                     sleep: Callable[[float], None] = time.sleep) -> int:
    """Poll until the rollout of `revision` (None: the current one) ends, or `timeout_s` passes. A
    control plane that cannot be reached (a restart) is asked again until the timeout; a refused token
    ends the wait at once (exit 2)."""
    started = clock()
    deadline = started + timeout_s
    wanted, last = revision, ""
    while True:
        remaining = deadline - clock()
        try:
            view = client.with_timeout(max(1.0, min(REQUEST_TIMEOUT_S, remaining))).call("GET", "/admin/rollout")
            judged = judge(view if isinstance(view, Mapping) else {}, wanted)
        except AdminRefused as exc:
            raise CommandError(str(exc), EXIT_USAGE) from None
        except AdminApiError as exc:
            judged = Judged(None, f"the control plane cannot be asked ({exc}); asking again")
        if wanted is None and judged.target is not None:
            wanted = judged.target  # the current rollout's, fixed at the first look
        if judged.line != last:
            say(f"[{clock() - started:5.0f}s] {judged.line}")
            last = judged.line
        if judged.code is not None:
            return judged.code
        if clock() >= deadline:
            say(f"timed out after {timeout_s:g} s: the rollout of {(wanted or 'the current revision')[:12]} has not "
                f"ended ({last})")
            return EXIT_TIMEOUT
        sleep(min(interval_s, max(0.0, deadline - clock())))  # a last look at the deadline


__all__ = ["DEFAULT_INTERVAL_S", "DEFAULT_TIMEOUT_S", "Judged", "judge", "revision_argument", "wait_for_rollout"]
