"""The rollout's frozen records: durable state, what a pass observed, and what a step decides."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType

from fleetllm.core.fleet.jsonvalue import EMPTY, Frozen
from fleetllm.core.fleet.model import DEFAULTS

ServerKey = tuple[str, int]  # (box, listen port), as the judge keys servers


class RolloutState(StrEnum):
    RUNNING = "running"
    PAUSED = "paused"  # no box is released; boxes being drained are routed again
    HALTED = "halted"  # a released box failed: it was rolled back; nothing more is released
    ABORTED = "aborted"  # a person stopped it: released but unconverged boxes were rolled back
    CONVERGED = "converged"  # every agent-managed box runs the target


class BoxState(StrEnum):
    WAITING = "waiting"  # not yet released the target
    DRAINING = "draining"  # its disrupted servers' deployments were deleted; released after drain_s
    RELEASED = "released"  # served the target; its changed servers are not yet Healthy and routed
    APPLIED = "applied"  # runs its released revision, changed servers Healthy and routed
    HALTED = "halted"  # rolled back to its last good revision (a failure, or an abort)


VERDICTS_UP = frozenset({"Healthy", "Stale"})  # the judge's serving verdicts


@dataclass(frozen=True)
class Rollout:
    """The durable rollout: one per target revision."""

    target: str
    state: RolloutState
    started_at: float
    updated_at: float
    reason: str = ""
    waves: int = 0


@dataclass(frozen=True)
class BoxRelease:
    """A box's durable release: what it is served (`revision`), what it last served healthily."""

    box: str
    revision: str
    last_good: str
    released_at: float
    state: BoxState
    drain_started_at: float | None = None
    wave: int = 0
    reason: str = ""


@dataclass(frozen=True)
class ServerSpec:
    """One server of a box's config at one revision, as the rollout sees it."""

    name: str
    model: str  # catalog name: the budget is per model
    port: int
    digest: str  # boot digest
    deployment: str  # its LiteLLM deployment id
    grace_s: int = DEFAULTS["/reconcile/health_grace_s"]  # the model's override, else the fleet's


@dataclass(frozen=True)
class BoxConfig:
    """A box's rendered JSON at one revision, reduced to what the rollout needs."""

    revision: str
    servers: tuple[ServerSpec, ...]
    boot: str = ""  # a digest of the box's other boot-lifetime parts (the gateway section)
    # The whole rendered JSON, for the stable division's box_change. It holds bearers: never shown.
    document: Mapping[str, Frozen] = field(default_factory=lambda: EMPTY, repr=False)

    _by_name: Mapping[str, ServerSpec] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        # Built once: a rollout step asks every box's configs for it several times a pass.
        object.__setattr__(self, "_by_name", MappingProxyType({s.name: s for s in self.servers}))

    def by_name(self) -> Mapping[str, ServerSpec]:
        return self._by_name


@dataclass(frozen=True)
class ReportFacts:
    """The box's latest report: the revision it applied and what failed."""

    revision: str
    install_failed: bool = False
    failed: frozenset[str] = frozenset()  # servers supervisord gave up on (crash loop)
    reported_at: float = 0.0


@dataclass(frozen=True)
class BoxInput:
    box: str
    managed: bool  # rollout mode auto and its latest report says agent=true
    target: BoxConfig | None  # None: the box is not in the placement at the target
    released: BoxConfig | None  # its released revision's config (None: unknown, a new box)
    last_good: BoxConfig | None
    report: ReportFacts | None = None
    card_gb: float | None = None
    new: bool = False  # no release yet and not placed at the revision it reported: it runs nothing of ours
    # Placed neither at the target nor at its released revision (read): it left the placement and was drained
    # and released, so a later target has nothing of its to disrupt (it retires: core.rollout.retire).
    left: bool = False


@dataclass(frozen=True)
class StepInput:
    target: str
    now: float
    boxes: Mapping[str, BoxInput]
    releases: Mapping[str, BoxRelease]
    rollout: Rollout | None
    verdicts: Mapping[ServerKey, str]  # the judge's verdict per server (values of Verdict)
    routed: frozenset[str] | None  # deployment ids LiteLLM holds; None: LiteLLM was not listed
    max_unavailable: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    drain_s: int = DEFAULTS["/rollout/drain_s"]
    # No LiteLLM (the control plane's config has no litellm section): the boxes route (their gateway, or a
    # balancer in front of them), so every server a box runs counts as routed, nothing is deleted before a
    # restart, and a drain waits for the requests in flight that the servers report (at most drain_s).
    boxes_route: bool = False
    in_flight: Mapping[ServerKey, int] = field(default_factory=lambda: MappingProxyType({}))  # absent: unknown

    def routes(self, deployment: str) -> bool:
        """Whether callers reach this deployment: LiteLLM lists it, or (no LiteLLM) its box routes it."""
        return self.boxes_route or (self.routed is not None and deployment in self.routed)

    def budget(self, model: str) -> int:
        return self.max_unavailable.get(model, DEFAULTS["/rollout/max_unavailable"])


@dataclass(frozen=True)
class ReleaseStatus:
    """A managed box's release as the rollout shows it (not the diff report's BoxStatus of a box)."""

    box: str
    state: BoxState
    released: str
    applied: str | None  # the revision the box last reported
    why: str = ""  # why it waits, or what it is doing


@dataclass(frozen=True)
class Halt:
    box: str
    reason: str
    rolled_back_to: str


@dataclass(frozen=True)
class Step:
    rollout: Rollout
    releases: Mapping[str, BoxRelease]  # the next state of every agent-managed box
    released: Mapping[str, str]  # boxes released this pass -> revision (rollbacks included)
    drain: frozenset[str]  # deployment ids to delete on purpose now (never held by the delete budget)
    held_out: frozenset[str]  # every deployment id kept out of LiteLLM (draining, released not yet applied)
    rollbacks: Mapping[str, str]  # box -> last good revision
    halt: Halt | None
    status: Mapping[str, ReleaseStatus]
    out: Mapping[str, tuple[ServerKey, ...]]  # per model: its servers out of service after this step

    @property
    def changed(self) -> bool:
        return bool(self.released or self.drain or self.rollbacks or self.halt)
