"""The fleet repository's commit statuses, the pure part: what a rollout's transition says on the forge.

Each transition of a revision's rollout (fleetllm.core.rollout.transitions) sets the commit status of
that revision (its SHA), under one context (`fleetllm/rollout` by default), linking to the control
plane's revision page:

    started, paused, resumed   pending   the rollout is under way (or paused: the description says by whom)
    converged                  success   every agent-managed box runs the revision
    halted, aborted            failure   a released box failed and was rolled back, or a person aborted it
    superseded                 error     a newer revision started before this one's rollout finished

GitHub's states are error, failure, pending and success (its OpenAPI description,
tests/contracts/github-statuses.openapi.json); a description longer than 140 characters is refused
with a 422, so it is cut to 140 here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from fleetllm.core.fleet.jsonvalue import JSON
from fleetllm.core.rollout.transitions import RolloutChange, Transition
from fleetllm.core.secret import Secret

MAX_DESCRIPTION = 140  # characters: GitHub answers 422 "description is too long (maximum is 140 characters)"
REVISION_PAGE = "/revision#rollout"  # the control plane's revision page, at its rollout section


class StatusState(StrEnum):
    PENDING = "pending"
    SUCCESS = "success"
    FAILURE = "failure"
    ERROR = "error"


STATE: dict[Transition, StatusState] = {
    Transition.STARTED: StatusState.PENDING,
    Transition.PAUSED: StatusState.PENDING,
    Transition.RESUMED: StatusState.PENDING,
    Transition.CONVERGED: StatusState.SUCCESS,
    Transition.HALTED: StatusState.FAILURE,
    Transition.ABORTED: StatusState.FAILURE,
    Transition.SUPERSEDED: StatusState.ERROR,
}


@dataclass(frozen=True)
class ForgeConfig:
    """forge.* in the config (fleetllm.settings builds it; docs/configuration.md; fleetllm.adapters.forge
    sends with it)."""

    kind: str  # "github"
    api_url: str  # without a trailing slash
    repository: str  # OWNER/NAME
    token: Secret | None = field(repr=False)  # None: this process does not read it (`fleetllm serve`)
    context: str
    control_plane_url: str | None  # the link of each status: its /revision page
    timeout_s: float
    attempts: int
    drain_timeout_s: float

    def statuses_url(self, sha: str) -> str:
        return f"{self.api_url}/repos/{self.repository}/statuses/{sha}"


@dataclass(frozen=True)
class CommitStatus:
    """One commit status to set: on `sha`, under `context`; `target_url` None: no link."""

    sha: str
    state: StatusState
    description: str
    context: str
    target_url: str | None = None

    def body(self) -> dict[str, JSON]:
        """The request body of GitHub's "Create a commit status"."""
        body: dict[str, JSON] = {"state": str(self.state), "description": self.description, "context": self.context}
        if self.target_url is not None:
            body["target_url"] = self.target_url
        return body


def clip(text: str, limit: int = MAX_DESCRIPTION) -> str:
    """`text` on one line, at most `limit` characters (an ellipsis says it was cut)."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[:limit - 1].rstrip() + "…"


def describe(change: RolloutChange) -> str:
    """What the status says, for a person looking at the commit."""
    waves = f"{change.waves} wave" + ("" if change.waves == 1 else "s")
    said = {
        Transition.STARTED: "Rolling out: agent-managed boxes move to it in waves",
        Transition.PAUSED: f"Rollout paused ({change.reason or 'by a person'}): no box is released until resumed",
        Transition.RESUMED: "Rolling out again (resumed)",
        Transition.CONVERGED: f"Converged: every agent-managed box runs it ({waves})",
        Transition.HALTED: f"Halted: {change.reason}",
        Transition.ABORTED: f"Aborted ({change.reason}): released boxes rolled back",
        Transition.SUPERSEDED: f"Superseded by {change.by[:12]} before its rollout finished",
    }
    return said[change.transition]


def revision_link(control_plane_url: str | None) -> str | None:
    """The link of every status: the control plane's revision page (None: no address configured)."""
    return control_plane_url.rstrip("/") + REVISION_PAGE if control_plane_url else None


def commit_status(change: RolloutChange, context: str, control_plane_url: str | None) -> CommitStatus:
    return CommitStatus(change.target, STATE[change.transition], clip(describe(change)), context,
                        revision_link(control_plane_url))


__all__ = ["MAX_DESCRIPTION", "CommitStatus", "ForgeConfig", "StatusState", "clip", "commit_status", "describe",
           "revision_link"]
