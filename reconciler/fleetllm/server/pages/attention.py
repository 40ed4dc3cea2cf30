"""The attention strip: everything that needs an operator, on every page and at /api/attention. Pure.

- unknown boxes that presented the fleet key (with the approval made for them, if any);
- servers the last pass judged Foreign, Stale, Stalled, Down or Missing;
- invalid commits on the tracked branch after the served one, and a failing git refresh;
- boxes the served revision cannot render for;
- LiteLLM drift: unmanaged deployments (those pointing at a fleet server first) and duplicates;
- the reconciler: its last pass failed, its deletes were held, it is overdue, or none was recorded;
- a commit held from the boxes: the passes run dry or the fleet is suspended while its rollout has not
  converged, the rollout is paused or aborted, or the passes work from another commit than the served
  one (a pin); and, not counted, the rollout running now and the dry run itself (a banner);
- secrets that work but are weak (a bearer salt shorter than 16 characters);
- capacity (fleet.yaml `capacity:`): a rental or termination failing, backing off, and a rental whose box has not
  presented itself long after it was rented (fleetllm.core.capacity.capacity_issues).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from fleetllm.adapters.state.passes import ActionRecord, DriftRecord, DuplicateRecord, PassMode, RolloutPassRecord
from fleetllm.adapters.state.records import Approval
from fleetllm.core.capacity import CapacityIssue, capacity_issues
from fleetllm.core.fleet.approve import ref_name
from fleetllm.core.fleet.model import ReconcileSettings
from fleetllm.core.judge.verdict import Verdict
from fleetllm.core.rollout.retire import shown
from fleetllm.core.schedule import overdue_after as pass_overdue_after
from fleetllm.server.pages.inputs import Inputs

ATTENTION_VERDICTS = (Verdict.FOREIGN, Verdict.STALE, Verdict.STALLED, Verdict.DOWN, Verdict.MISSING)


def overdue_after(settings: ReconcileSettings) -> float:
    """A pass is overdue after two intervals and a minute (fleetllm.core.schedule.overdue_after)."""
    return pass_overdue_after(settings.interval_s)


@dataclass(frozen=True)
class ApprovalView:
    at: float
    models: tuple[str, ...]
    branch: str
    commit: str
    base_revision: str


@dataclass(frozen=True)
class UnknownBox:
    box: str
    first_seen: float
    last_seen: float
    count: int
    peer: str
    claimed_host: str | None
    forwarded_for: str | None
    approval: ApprovalView | None  # the approval committed for it (not merged or not served yet)


@dataclass(frozen=True)
class RetiredBox:
    """A box that left the placement (core.rollout.retire): shown as retired, never as an unknown box, and not
    counted as needing attention (it leaves by itself)."""

    box: str
    state: str  # draining | retiring | retired
    revision: str  # the commit at which it left the placement
    left_at: float
    retired_at: float | None
    text: str


@dataclass(frozen=True)
class ServerIssue:
    box: str
    port: int
    name: str
    model: str
    verdict: str
    reason: str


@dataclass(frozen=True)
class InvalidCommit:
    revision: str
    head: bool  # the branch head
    errors: tuple[str, ...]


@dataclass(frozen=True)
class ReconcileIssue:
    state: str  # "failing" | "blocked" | "overdue" | "missing"
    message: str
    started_at: float | None = None
    errors: tuple[str, ...] = ()
    failed_actions: tuple[ActionRecord, ...] = ()


@dataclass(frozen=True)
class AttentionView:
    generated_at: float
    count: int
    unknown_boxes: tuple[UnknownBox, ...]
    servers: tuple[ServerIssue, ...]
    invalid_commits: tuple[InvalidCommit, ...]
    refresh_error: str | None
    render_errors: Mapping[str, str]
    drift: tuple[DriftRecord, ...]
    duplicates: tuple[DuplicateRecord, ...]
    reconcile: tuple[ReconcileIssue, ...]
    approve_models: tuple[str, ...]  # the catalog an approval may choose from
    approve_slots: int  # at most this many servers on one box
    secrets: tuple[str, ...] = ()  # weak but working secrets (a short salt): what to do, never a value
    retired: tuple[RetiredBox, ...] = ()  # boxes that left the placement: informational, not counted
    held: tuple[str, ...] = ()  # which commit does not reach the boxes, and why (counted)
    rolling: str = ""  # the rollout running now, box by box (not counted: it is on its way)
    dry_run: str = ""  # the passes run dry: shown on every page (not counted by itself)
    capacity: tuple[CapacityIssue, ...] = ()  # rentals and terminations failing (backing off) or slow (counted)


def _approval_for(box: str, approvals: tuple[Approval, ...]) -> ApprovalView | None:
    # `approvals` is newest first; a branch approval is named approve/<host>, a tracked one by its host
    found = next((a for a in approvals if a.host == box or a.branch == ref_name(box)), None)
    if found is None:
        return None
    return ApprovalView(found.at, found.models, found.branch, found.commit, found.base_revision)


def reconcile_issues(inputs: Inputs) -> tuple[ReconcileIssue, ...]:
    last = inputs.last_pass
    if last is None:
        if not inputs.settings.reconciler_expected:
            return ()
        return (ReconcileIssue("missing", "no reconcile pass recorded yet: verdicts appear once `fleetllm reconcile` "
                                          "(or `fleetllm apply`) has run against this state store"),)
    issues = []
    settings = inputs.served.fleet.settings.reconcile if inputs.served is not None else ReconcileSettings()
    late = inputs.now - last.started_at
    if inputs.settings.reconciler_expected and late > overdue_after(settings):
        issues.append(ReconcileIssue("overdue", f"the last reconcile pass started {int(late)} s ago; passes are due "
                                                f"every {settings.interval_s} s: is `fleetllm reconcile` running?",
                                     last.started_at))
    if not last.ok:
        failed = tuple(a for a in last.actions if not a.ok)
        issues.append(ReconcileIssue("failing", f"the last reconcile pass failed: {len(last.errors)} observation "
                                                f"error(s), {len(failed)} failed LiteLLM write(s)",
                                     last.started_at, last.errors, failed))
    if last.blocked:
        issues.append(ReconcileIssue("blocked", "deletes held back by a safety valve", last.started_at,
                                     last.blocked))
    if last.rollout is not None and last.rollout.state == "halted":
        issues.append(ReconcileIssue("rollout-halted", f"the rollout of {last.rollout.target[:12]} halted: "
                                     f"{last.rollout.reason}. Fix or revert with a new commit (it starts a new "
                                     "rollout), or `fleetllm rollout resume` to retry", last.started_at))
    return tuple(issues)


DRY_RUN = ("Dry run: the reconciler writes nothing to LiteLLM and releases nothing to the boxes "
           "(reconcile.dry_run, or a command run dry); set reconcile.dry_run to false to act")


def _boxes_behind(rollout: RolloutPassRecord) -> str:
    behind = sorted(b for b, state in rollout.boxes.items() if state != "applied")
    return f"{len(behind)} box(es) not on it ({', '.join(behind[:4])}{', ...' if len(behind) > 4 else ''})"


def held_commits(inputs: Inputs) -> tuple[str, ...]:
    """Why the served commit does not reach the boxes, in every mode (empty: it does, or it is on its way)."""
    last = inputs.last_pass
    if last is None:
        return ()
    found: list[str] = []
    served = inputs.served.revision if inputs.served is not None else None
    rollout = last.rollout
    if (served is not None and last.revision != served and inputs.applied_at is not None
            and last.started_at >= inputs.applied_at):
        found.append(f"commit {served[:12]} is served, but the reconciler's passes work from {last.revision[:12]} "
                     "(a pin: `fleetllm unpin` ends it): the boxes are not released the served commit")
    unrouted = sorted(f"{s.box}:{s.port}" for s in last.servers if s.deployment is False and s.verdict == "Healthy")
    if last.mode != PassMode.APPLY and unrouted:  # a pass that applies creates them; a dry run never does
        found.append(f"{len(unrouted)} Healthy server(s) have no LiteLLM deployment ({', '.join(unrouted[:4])}"
                     f"{', ...' if len(unrouted) > 4 else ''}), and the reconciler "
                     + ("runs dry" if last.mode == PassMode.PLAN else "is suspended") + ": callers cannot reach them")
    if rollout is None or rollout.state == "converged":
        return tuple(found)
    target = rollout.target[:12]
    if last.mode == PassMode.PLAN:
        found.append(f"commit {target} is held: the reconciler runs dry, so it releases nothing to the boxes "
                     f"and writes nothing to LiteLLM; {_boxes_behind(rollout)}. Set reconcile.dry_run to false")
    elif last.mode == PassMode.SUSPENDED:
        found.append(f"commit {target} is held: the fleet is suspended (`fleetllm resume` ends it); "
                     f"{_boxes_behind(rollout)}")
    elif rollout.state in ("paused", "aborted"):
        found.append(f"commit {target} is held: its rollout is {rollout.state} (`fleetllm rollout resume`, or a new "
                     f"commit); {_boxes_behind(rollout)}")
    return tuple(found)


def rolling(inputs: Inputs) -> str:
    """The rollout a pass that applied is running now: its target, waves and where each box is."""
    last = inputs.last_pass
    rollout = last.rollout if last is not None else None
    if last is None or rollout is None or rollout.state != "running" or last.mode != PassMode.APPLY:
        return ""
    states: dict[str, int] = {}
    for state in rollout.boxes.values():
        states[state] = states.get(state, 0) + 1
    shown = ", ".join(f"{n} {state}" for state, n in sorted(states.items()))
    return f"Rolling out {rollout.target[:12]}: wave {rollout.waves}; boxes: {shown or 'none'}"


def attention_view(inputs: Inputs) -> AttentionView:
    last = inputs.last_pass
    unknown = tuple(UnknownBox(e.box, e.first_seen, e.last_seen, e.count, e.peer, e.claimed_host, e.forwarded_for,
                               _approval_for(e.box, inputs.approvals)) for e in inputs.attention
                    if e.box not in inputs.retirements)
    retired = tuple(RetiredBox(r.box, str(r.state), r.revision, r.left_at, r.retired_at, shown(r))
                    for r in sorted(inputs.retirements.values(), key=lambda r: (-r.left_at, r.box)))
    wanted = {str(v) for v in ATTENTION_VERDICTS}
    servers = tuple(ServerIssue(s.box, s.port, s.name, s.model, s.verdict, s.reason)
                    for s in (last.servers if last else ()) if s.verdict in wanted)
    head = inputs.attempted.revision if inputs.attempted is not None else None
    invalid = tuple(InvalidCommit(c.revision, c.revision == head, c.errors) for c in inputs.skipped)
    drift = tuple(sorted(last.drift_details, key=lambda d: (d.fleet_server is None, d.id))) if last else ()
    duplicates = last.duplicates if last else ()
    render_errors = dict(inputs.served.render_errors) if inputs.served is not None else {}
    reconcile = reconcile_issues(inputs)
    fleet = inputs.served.fleet if inputs.served is not None else None
    held = held_commits(inputs)
    capacity = capacity_issues(inputs.capacity_attempts, inputs.rental_waits, inputs.now)
    count = (len(unknown) + len(servers) + len(invalid) + (inputs.refresh.error is not None) + len(render_errors)
             + len(drift) + len(duplicates) + len(reconcile) + len(inputs.settings.secret_warnings) + len(held)
             + len(capacity))
    return AttentionView(
        generated_at=inputs.now, count=count, unknown_boxes=unknown, servers=servers, invalid_commits=invalid,
        refresh_error=inputs.refresh.error, render_errors=render_errors, drift=drift, duplicates=duplicates,
        reconcile=reconcile, approve_models=tuple(sorted(fleet.recipes)) if fleet else (),
        approve_slots=min(len(fleet.settings.listen_ports), fleet.settings.max_servers_per_box) if fleet else 0,
        secrets=inputs.settings.secret_warnings, retired=retired, held=held, rolling=rolling(inputs),
        dry_run=DRY_RUN if last is not None and last.mode == PassMode.PLAN else "", capacity=capacity)
