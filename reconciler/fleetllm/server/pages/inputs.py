"""What the status pages read, gathered once per request: the control plane's in-memory revision
state and the state store (through its interfaces only). The views are pure functions of `Inputs`.

The pages never run a reconcile pass: verdicts come from the last pass the reconciler recorded.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from fleetllm.adapters.state.passes import PassRecord
from fleetllm.adapters.state.records import Approval, AttentionEntry, FetchRecord
from fleetllm.core.boxreport import BoxReport
from fleetllm.core.capacity import Attempts, RentalWait
from fleetllm.core.rollout.retire import Retirement
from fleetllm.server.revisions import Attempt, Invalid, RefreshStatus, Rendered
from fleetllm.server.runtime import Runtime
from fleetllm.settings import ApproveTarget, ControlPlaneConfig


@dataclass(frozen=True)
class Settings:
    """The parts of the control-plane config the pages show or act on (no secret among them)."""

    repo_where: str  # the repository, credentials removed
    repo_url: str | None
    repo_dir: str  # where `fleetllm diff --repo` finds the fleet files on this machine
    branch: str
    reconciler_expected: bool  # a reconciler is configured: a missing or late pass needs attention
    approve_target: ApproveTarget
    secret_warnings: tuple[str, ...] = ()  # secrets that work but are weak (a short salt); never a value
    boxes_route: bool = False  # no litellm section: the boxes route (their gateway, a balancer), not LiteLLM

    @classmethod
    def of(cls, rt: Runtime) -> Settings:
        config: ControlPlaneConfig = rt.config
        repo = config.repo
        if repo.path is not None:
            where = Path(repo.path) / repo.subdir if repo.subdir else Path(repo.path)
        else:
            where = rt.repo.clone_dir
        return cls(repo_where=rt.repo.where, repo_url=repo.url, repo_dir=str(where), branch=repo.branch,
                   reconciler_expected=config.reconcile.enabled,  # rollouts need it, with or without LiteLLM
                   approve_target=repo.approve_target, secret_warnings=secret_warnings(config),
                   boxes_route=config.litellm is None)


def secret_warnings(config: ControlPlaneConfig) -> tuple[str, ...]:
    """Warnings about secrets that are accepted but weak. Names the config field, never a value."""
    salt = config.secrets.vllm_api_salt.warning()
    return (f"secrets.vllm_api_salt: {salt}",) if salt is not None else ()


@dataclass(frozen=True)
class Inputs:
    now: float
    settings: Settings
    served: Rendered | None
    applied_at: float | None
    attempted: Attempt | None
    skipped: tuple[Invalid, ...]
    refresh: RefreshStatus
    passes: tuple[PassRecord, ...]  # newest first
    attention: tuple[AttentionEntry, ...]  # unknown boxes only (placed ones filtered out)
    approvals: tuple[Approval, ...]  # newest first
    fetches: Mapping[str, FetchRecord] = field(default_factory=lambda: MappingProxyType({}))
    retirements: Mapping[str, Retirement] = field(default_factory=lambda: MappingProxyType({}))  # left the placement
    reports: Mapping[str, BoxReport] = field(default_factory=lambda: MappingProxyType({}))
    capacity_attempts: Attempts = field(default_factory=Attempts)  # failed rentals and terminations backing off
    rental_waits: Mapping[str, RentalWait] = field(default_factory=lambda: MappingProxyType({}))  # not heard of yet

    @property
    def last_pass(self) -> PassRecord | None:
        return self.passes[0] if self.passes else None


def gather(rt: Runtime, *, boxes: bool = False, passes: int = 1) -> Inputs:
    """`boxes`: also the per-box fetch and report records (the fleet view); `passes`: how many records."""
    tracker = rt.tracker
    served = tracker.served
    placed = served.fleet.boxes if served is not None else {}
    store = rt.store
    return Inputs(
        now=rt.clock(), settings=Settings.of(rt), served=served, applied_at=tracker.applied_at,
        attempted=tracker.attempted, skipped=tracker.skipped, refresh=tracker.refresh_status,
        passes=tuple(store.recent_passes(max(1, passes))),
        attention=tuple(e for e in store.attention() if e.box not in placed),
        approvals=tuple(store.approvals()),
        retirements=MappingProxyType({b: r for b, r in store.retirements().items() if b not in placed}),
        fetches=MappingProxyType(store.last_config_served()) if boxes else MappingProxyType({}),
        reports=MappingProxyType(store.latest_reports()) if boxes else MappingProxyType({}),
        capacity_attempts=store.capacity_attempts(), rental_waits=MappingProxyType(store.rental_waits()))
