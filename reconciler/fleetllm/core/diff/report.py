"""The change report between two valid fleets: what merging HEAD over BASE will do to the running fleet.

Every item carries the lifetime (the box contract's table) that decides when it takes effect:
server changes are boot lifetime (a box applies them when it re-fetches its config and restarts
vLLM), deployment changes are live lifetime (the reconciler applies them at its next pass), a new
box needs provisioning. Bearers are never part of a report, only where they derive from.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TypeAlias

from fleetllm.core.fleet.jsonvalue import JSON


class Lifetime(StrEnum):
    BAKED = "baked"  # in the box template: re-provision
    BOOT = "boot"  # the box must re-fetch its config and restart vLLM
    LIVE = "live"  # the reconciler applies it at its next pass
    NONE = "none"  # no effect on the running fleet (descriptions, notes, validation limits)


class Absent:
    """A field missing on one side of a change (distinct from an explicit null)."""

    _instance: Absent | None = None

    def __new__(cls) -> Absent:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT = Absent()
Value: TypeAlias = "JSON | Absent"


@dataclass(frozen=True)
class FieldChange:
    path: tuple[str, ...]  # e.g. ("max_model_len",) or ("model_info", "context_window")
    before: Value
    after: Value
    lifetime: Lifetime

    @property
    def field(self) -> str:
        return ".".join(self.path)


@dataclass(frozen=True, order=True)
class ServerRef:
    """One vLLM process: where it listens, its process name and its catalog model."""

    box: str
    port: int
    name: str
    model: str

    @property
    def address(self) -> str:
        return f"{self.box}:{self.port}"


class ServerAction(StrEnum):
    ADD = "add"
    REMOVE = "remove"
    MOVE = "move"  # another box or another listen port (so a new bearer)
    CHANGE = "change"  # same box and port; boot fields, process name or bearer source changed


@dataclass(frozen=True)
class ServerChange:
    action: ServerAction
    before: ServerRef | None
    after: ServerRef | None
    fields: tuple[FieldChange, ...] = ()  # boot fields, host and port excluded (a move says those)
    bearer: BearerChange | None = None

    @property
    def ref(self) -> ServerRef:
        ref = self.after or self.before
        assert ref is not None
        return ref

    def touches(self) -> set[tuple[str, str]]:
        """(box, process name) of each side: the entries of the box JSON this change alters."""
        return {(r.box, r.name) for r in (self.before, self.after) if r is not None}


@dataclass(frozen=True)
class BearerChange:
    """A kept server whose bearer changes. Only the bearers' sources are named, never a bearer."""

    server: ServerRef  # the server after the change
    before: str  # e.g. "derived from 203.0.113.10:8001" or "the legacy shared key"
    after: str


class BoxStatus(StrEnum):
    NEW = "new"  # provision it; it fetches its config at first boot
    REMOVED = "removed"  # its deployments go; the instance keeps running until destroyed
    RESTART = "restart"  # must re-fetch its config and restart vLLM
    CHANGED = "changed"  # only box details changed (provider, capacity, notes, reconcile mode)


@dataclass(frozen=True)
class BoxImpact:
    """One box's line in the report: what the change does to it as a whole (its status, the processes it
    starts, restarts and stops, its placement details). Which servers restart is the stable division's
    fleetllm_contract.division.BoxChange."""

    name: str
    status: BoxStatus
    start: tuple[str, ...] = ()  # process names new on the box (added, moved in, renamed to)
    restart: tuple[str, ...] = ()  # process names restarted with another configuration
    stop: tuple[str, ...] = ()  # process names that stop (removed, moved out, renamed from)
    details: tuple[FieldChange, ...] = ()  # box details from placement.yaml
    paused: bool = False  # reconcile: paused at HEAD: the reconciler changes nothing for it
    redivided: tuple[str, ...] = ()  # unchanged servers in `restart` only because their card is re-divided
    card_known: bool = True  # False: no gpu_memory_gb, so a server added may re-divide the card (counted so)


class DeploymentAction(StrEnum):
    CREATE = "create"
    UPDATE = "update"
    REPLACE = "replace"  # another model at the same box and port: delete, then create
    DELETE = "delete"


@dataclass(frozen=True)
class Route:
    """A LiteLLM deployment's owned fields. Identity is (box, listen port)."""

    model_name: str
    served_model_name: str
    params: JSON
    model_info: JSON
    bearer: str  # the bearer's source, never the bearer

    def as_json(self) -> dict[str, JSON]:
        return {"model_name": self.model_name, "served_model_name": self.served_model_name,
                "params": self.params, "model_info": self.model_info, "bearer": self.bearer}


@dataclass(frozen=True)
class DeploymentChange:
    action: DeploymentAction
    box: str
    port: int
    before: Route | None
    after: Route | None
    fields: tuple[FieldChange, ...] = ()
    paused: bool = False  # box or recipe paused: the reconciler will not apply it until resumed

    @property
    def address(self) -> str:
        return f"{self.box}:{self.port}"


class Level(StrEnum):
    OUTAGE = "outage"  # a model name stops being served
    WARNING = "warning"
    NOTE = "note"


@dataclass(frozen=True)
class Alert:
    level: Level
    code: str  # stable id, e.g. "last-server", "box-removed"
    message: str
    subject: str  # the model or box the warning is about


@dataclass(frozen=True)
class RecipeChange:
    model: str
    action: str  # "add" | "remove" | "change"
    fields: tuple[FieldChange, ...]
    servers: int  # servers placed with this recipe (at HEAD; at BASE for a removed one)


@dataclass(frozen=True)
class AllowedOption:
    """A vLLM option that runs code or reads files on the box, allowed in a recipe at HEAD but not at BASE
    (fleetllm.core.fleet.options): the pull-request comment lists each one at its top."""

    model: str
    option: str  # without `--`
    effect: str  # what it does on the box
    used: bool  # the recipe's args or settings use it at HEAD (else only allowed, for a later change)
    servers: int  # servers placed with this recipe at HEAD


# How long a restarted vLLM server is out, for the estimates below: fleetllm has no load-time setting
# (fleet.yaml's health_grace_s is a deadline, not an estimate), so this is stated with every estimate.
ASSUMED_LOAD_S = 120


@dataclass(frozen=True)
class Disruption:
    """A model that will serve from fewer servers for a while: its servers that restart, one at a time."""

    model: str
    restarting: tuple[ServerRef, ...]  # its servers (at HEAD) that restart, boot change or re-division
    serving: int  # its servers at HEAD
    seconds: int  # how long it has fewer servers: len(restarting) x ASSUMED_LOAD_S (one at a time)
    out_at_once: int = 1  # the most of them out together: 1 by the report alone, the rollout's figure after waves


@dataclass(frozen=True)
class Report:
    base: str
    head: str
    boxes: tuple[BoxImpact, ...]
    servers: tuple[ServerChange, ...]
    deployments: tuple[DeploymentChange, ...]
    alerts: tuple[Alert, ...]
    recipes: tuple[RecipeChange, ...]
    settings: tuple[FieldChange, ...]
    disruptions: tuple[Disruption, ...] = ()
    allowed: tuple[AllowedOption, ...] = ()  # risky vLLM options newly allowed at HEAD

    @property
    def changed(self) -> bool:
        """Anything at all differs between the two fleets (descriptions included)."""
        return bool(self.boxes or self.servers or self.deployments or self.recipes or self.settings)

    @property
    def bearers(self) -> tuple[BearerChange, ...]:
        return tuple(s.bearer for s in self.servers if s.bearer is not None)

    def touched_servers(self) -> set[tuple[str, str]]:
        return {t for s in self.servers for t in s.touches()}

    def boxes_with(self, status: BoxStatus) -> tuple[BoxImpact, ...]:
        return tuple(b for b in self.boxes if b.status is status)

    def deployments_with(self, action: DeploymentAction) -> tuple[DeploymentChange, ...]:
        return tuple(d for d in self.deployments if d.action is action)
