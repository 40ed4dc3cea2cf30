"""Retiring a box that left the placement (issue 25, item 1). Pure.

A box the control plane knows (it has a release or a report) that the target revision does not place:
1. draining: its LiteLLM deployments leave first (the rollout's drain for an agent box, the plan's deletes
   for the others); GET /vllm/config keeps serving it what it runs;
2. retiring: once none of its deployments is left (and an agent box was released the target), it is served
   a box JSON with no servers (`retiring_document`): its installer or agent removes every program, the
   agent's own included, and reports;
3. retired: once it reported that empty config, or `retire_s` (fleet.yaml rollout.retire_s) passed, the
   rollout forgets it (its release record) and GET /vllm/config answers 404 (never an "Unknown box").
A box the placement names again is a new box: its retirement and its release are forgotten.
`fleetllm rollout forget BOX` retires a box at once (one that vanished without reporting).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from types import MappingProxyType

from fleetllm.core.fleet.jsonvalue import JSON


class RetireState(StrEnum):
    DRAINING = "draining"  # left the placement; its deployments leave LiteLLM first
    RETIRING = "retiring"  # served a box JSON with no servers until it reports it
    RETIRED = "retired"  # reported empty (or retire_s passed, or forgotten): answered 404


@dataclass(frozen=True)
class Retirement:
    """A box that left the placement, as the state store keeps it."""

    box: str
    revision: str  # the commit at which a pass found it gone (its retiring box JSON's revision)
    left_at: float  # when a pass found it gone
    state: RetireState
    kept_revision: str = ""  # the revision it runs while draining ("": none known)
    retiring_at: float | None = None
    retired_at: float | None = None
    reason: str = ""  # how it retired: reported empty, retire_s passed, forgotten by someone


@dataclass(frozen=True)
class EmptyReport:
    """A box's latest report, as retirement reads it."""

    revision: str
    reported_at: float
    empty: bool  # installed with no server


@dataclass(frozen=True)
class RetireInput:
    target: str
    placed: frozenset[str]  # the boxes the target places
    known: Mapping[str, str]  # box -> the revision it runs (its release, else its latest report's)
    retirements: Mapping[str, Retirement]
    reports: Mapping[str, EmptyReport]
    released_target: frozenset[str]  # boxes whose release (after this pass's step) is the target
    managed: frozenset[str]  # boxes with a release record
    remaining: frozenset[str] | None  # boxes with a deployment left in LiteLLM after this pass (None: unknown)
    now: float
    retire_s: int


@dataclass(frozen=True)
class RetireStep:
    retirements: Mapping[str, Retirement]  # every record after this pass
    forget: frozenset[str]  # boxes whose release record the rollout drops now
    changed: Mapping[str, Retirement]  # records this pass started or moved on


def retire_step(inp: RetireInput) -> RetireStep:
    """One pass of retirement (see the module's docstring)."""
    out: dict[str, Retirement] = {}
    changed: dict[str, Retirement] = {}
    forget: set[str] = set()
    for box in sorted(set(inp.retirements) | set(inp.known)):
        current = inp.retirements.get(box)
        if box in inp.placed:  # placed again: a new box (approved as any other)
            if current is not None and current.state is not RetireState.DRAINING:
                forget.add(box)
            continue
        record = current or Retirement(box, inp.target, inp.now, RetireState.DRAINING, inp.known.get(box, ""))
        record = advance(record, inp)
        if record.state is RetireState.RETIRED and box in inp.managed:
            forget.add(box)
        out[box] = record
        if record != current:
            changed[box] = record
    return RetireStep(MappingProxyType(out), frozenset(forget), MappingProxyType(changed))


def advance(record: Retirement, inp: RetireInput) -> Retirement:
    box = record.box
    if record.state is RetireState.DRAINING:
        drained = inp.remaining is not None and box not in inp.remaining and (
            box not in inp.managed or box in inp.released_target)
        if not drained:
            return record
        record = replace(record, state=RetireState.RETIRING, retiring_at=inp.now)
    if record.state is RetireState.RETIRING:
        since = record.retiring_at if record.retiring_at is not None else record.left_at
        report = inp.reports.get(box)
        if report is not None and report.empty and report.revision == record.revision and report.reported_at >= since:
            return replace(record, state=RetireState.RETIRED, retired_at=inp.now,
                           reason="it reported that it runs no server")
        if inp.now - since >= inp.retire_s:
            return replace(record, state=RetireState.RETIRED, retired_at=inp.now,
                           reason=f"it did not report an empty box within rollout.retire_s ({inp.retire_s}s)")
    return record


def forgotten(box: str, record: Retirement | None, target: str, now: float, actor: str) -> Retirement:
    """The record `fleetllm rollout forget BOX` writes: retired now, by `actor`."""
    base = record or Retirement(box, target, now, RetireState.RETIRED)
    return replace(base, state=RetireState.RETIRED, retired_at=now, reason=f"forgotten by {actor}")


def retiring_document(box: str, revision: str, report_key: str) -> dict[str, JSON]:
    """The box JSON a retiring box is served: the box contract's object with no server (and no gateway
    nor agent: the installer removes every fleetllm program, the agent's own included), with the box's
    report key, so that its report of an empty box is taken (that report is what retires it)."""
    return {"host": box, "revision": revision, "servers": [], "report_key": report_key}


def shown(record: Retirement) -> str:
    """One line for the pages, the API and the CLI: what state, since when, by which commit."""
    if record.state is RetireState.RETIRED:
        return f"retired (left the placement at {record.revision[:12]}): {record.reason}"
    if record.state is RetireState.RETIRING:
        return f"retiring (left the placement at {record.revision[:12]}): served a box JSON with no servers"
    return f"draining (left the placement at {record.revision[:12]}): its LiteLLM deployments leave first"
