"""Reconcile pass records: what each pass saw, judged and did, kept in the state store as one JSON
document per pass (read by `fleetllm` commands, metrics, and the status pages).

A record carries the pass's summary (verdict counts, actions, errors) and, for the status pages,
the detail: one `ServerRecord` per intended server (verdict, reason, public endpoint, max_model_len
intended and served, whether its LiteLLM deployment exists) and the LiteLLM drift found. Stores keep
the detail of the newest passes only (`PassRecord.summary()` is what older ones keep). Records never
hold a bearer: endpoints and deployment ids only. `from_json` reads records written by any earlier
version (missing fields take their defaults).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

from fleetllm.core.rollout.transitions import RolloutChange, Transition


class PassMode(StrEnum):
    """What a pass did with its plan (`PassRecord.mode`, a free-text column of reconcile_pass)."""

    APPLY = "apply"  # written to LiteLLM
    PLAN = "plan"  # a dry run (reconcile.dry_run, fleetllm plan, the demo): nothing written
    SUSPENDED = "suspended"  # the fleet was suspended (fleetllm suspend): observed and recorded, nothing written

    @classmethod
    def of(cls, *, apply: bool, suspended: bool = False) -> PassMode:
        return cls.APPLY if apply else cls.SUSPENDED if suspended else cls.PLAN


@dataclass(frozen=True)
class ActionRecord:
    kind: str
    id: str
    ok: bool
    outcome: str
    error: str | None = None


@dataclass(frozen=True)
class ServerRecord:
    """One intended server as the pass judged it."""

    box: str
    port: int  # the listen port
    name: str
    model: str
    verdict: str
    reason: str
    endpoint: str | None = None  # the public host:port dialled; None when unknown
    max_model_len: int | None = None  # what the repository asks for
    served_max_model_len: int | None = None  # what the server's /v1/models said
    deployment: bool | None = None  # a managed LiteLLM deployment exists; None: the LiteLLM listing failed
    paused: bool = False


@dataclass(frozen=True)
class DriftRecord:
    """A LiteLLM deployment fleetllm does not manage (never touched, reported)."""

    id: str
    model_name: str
    reason: str
    api_base: str | None = None
    fleet_server: str | None = None  # "box:port" when it points at a fleet server's address


@dataclass(frozen=True)
class DuplicateRecord:
    """Several deployments of one model name at one address, at least one of them not ours."""

    api_base: str
    model_name: str
    ids: tuple[str, ...]


@dataclass(frozen=True)
class CostRecord:
    """What the fleet cost as the pass saw it, USD per hour (fleetllm.core.cost: the model)."""

    total: float
    boxes: Mapping[str, float] = dataclasses.field(default_factory=dict)  # box -> its price
    models: Mapping[str, float] = dataclasses.field(default_factory=dict)  # model -> its share
    unpriced: tuple[str, ...] = ()  # rented boxes whose price the pass could not read
    what: Mapping[str, str] = dataclasses.field(default_factory=dict)  # box -> "1 × H100 80GB on RunPod"

    def to_json(self) -> dict[str, Any]:
        return {"total": self.total, "boxes": dict(self.boxes), "models": dict(self.models),
                "unpriced": list(self.unpriced), "what": dict(self.what)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CostRecord:
        return cls(float(data.get("total", 0.0)), dict(data.get("boxes", {})), dict(data.get("models", {})),
                   tuple(data.get("unpriced", ())), dict(data.get("what", {})))


TRANSITIONS = frozenset(str(t) for t in Transition)  # a record of a later version may name others: left out


def _change(data: Mapping[str, Any]) -> RolloutChange:
    return RolloutChange(data["target"], Transition(data["transition"]), data["at"], data.get("reason", ""),
                         data.get("waves", 0), data.get("by", ""), data.get("started_at", 0.0))


@dataclass(frozen=True)
class RolloutPassRecord:
    """What the staged rollout did in the pass (issue 14)."""

    target: str
    state: str
    reason: str = ""
    waves: int = 0
    released: Mapping[str, str] = dataclasses.field(default_factory=dict)  # box -> revision
    drained: tuple[str, ...] = ()  # deployment ids deleted on purpose this pass
    held_out: tuple[str, ...] = ()
    rollbacks: Mapping[str, str] = dataclasses.field(default_factory=dict)
    boxes: Mapping[str, str] = dataclasses.field(default_factory=dict)  # box -> state
    out: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)  # model -> "box:port" out
    halt: str = ""  # the rollout halted in this pass: why
    changes: tuple[RolloutChange, ...] = ()  # the rollout's transitions this pass recorded (started, converged...)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RolloutPassRecord:
        return cls(data["target"], data["state"], data.get("reason", ""), data.get("waves", 0),
                   dict(data.get("released", {})), tuple(data.get("drained", ())), tuple(data.get("held_out", ())),
                   dict(data.get("rollbacks", {})), dict(data.get("boxes", {})),
                   {k: tuple(v) for k, v in data.get("out", {}).items()}, data.get("halt", ""),
                   tuple(_change(c) for c in data.get("changes", ()) if c.get("transition") in TRANSITIONS))


@dataclass(frozen=True)
class PassRecord:
    started_at: float
    duration_s: float
    revision: str
    mode: str  # a PassMode's value; a str, so that records of any version (and any later mode) stay readable
    verdicts: Mapping[str, int]
    actions: tuple[ActionRecord, ...] = ()
    errors: tuple[str, ...] = ()
    blocked: tuple[str, ...] = ()
    held: int = 0
    drift: int = 0
    servers: tuple[ServerRecord, ...] = ()
    drift_details: tuple[DriftRecord, ...] = ()
    duplicates: tuple[DuplicateRecord, ...] = ()
    head: str | None = None  # the tracked branch's head when it was not valid (the pass ran on `revision`)
    head_errors: tuple[str, ...] = ()  # why the head is not valid (validation diagnostics, no secrets)
    rollout: RolloutPassRecord | None = None
    cost: CostRecord | None = None  # None: a record of an earlier version, or a pass that priced nothing

    @property
    def head_valid(self) -> bool:
        return self.head is None or self.head == self.revision

    @property
    def written(self) -> bool:
        """Whether the pass wrote its plan (its actions are results); else they are what it would write."""
        return self.mode == PassMode.APPLY

    @property
    def ok(self) -> bool:
        return not self.errors and all(a.ok for a in self.actions)

    @property
    def detailed(self) -> bool:
        return bool(self.servers or self.drift_details or self.duplicates)

    def summary(self) -> PassRecord:
        """The record without its per-server and drift detail (what older passes keep)."""
        return dataclasses.replace(self, servers=(), drift_details=(), duplicates=())

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["verdicts"] = dict(self.verdicts)
        if self.rollout is not None:
            changes = [{**asdict(c), "transition": str(c.transition)} for c in self.rollout.changes]
            data["rollout"] = {**asdict(self.rollout), "released": dict(self.rollout.released), "changes": changes,
                               "rollbacks": dict(self.rollout.rollbacks), "boxes": dict(self.rollout.boxes),
                               "out": {k: list(v) for k, v in self.rollout.out.items()}}
        if self.cost is not None:
            data["cost"] = self.cost.to_json()
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PassRecord:
        return cls(data["started_at"], data["duration_s"], data["revision"], data["mode"], dict(data["verdicts"]),
                   tuple(ActionRecord(**a) for a in data.get("actions", ())), tuple(data.get("errors", ())),
                   tuple(data.get("blocked", ())), data.get("held", 0), data.get("drift", 0),
                   tuple(ServerRecord(**s) for s in data.get("servers", ())),
                   tuple(DriftRecord(**d) for d in data.get("drift_details", ())),
                   tuple(DuplicateRecord(d["api_base"], d["model_name"], tuple(d["ids"]))
                         for d in data.get("duplicates", ())),
                   data.get("head"), tuple(data.get("head_errors", ())),
                   RolloutPassRecord.from_json(data["rollout"]) if data.get("rollout") else None,
                   CostRecord.from_json(data["cost"]) if data.get("cost") else None)
