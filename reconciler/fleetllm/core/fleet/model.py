"""The typed, immutable fleet model built from a valid repository.

Lifetimes (the box contract's table) are explicit in the types:
- `VllmRecipe` is boot lifetime: a change reaches a box only when it re-fetches and restarts vLLM;
- `LitellmRoute` is live lifetime: the reconciler applies it to LiteLLM at its next pass;
- placement (`Box`, `Placement`) is boot lifetime for the boxes it touches and live for LiteLLM.

fleet.yaml's defaults are written once, as schemas/fleet.schema.json's `default`s: the dataclasses below
read theirs from it (`DEFAULTS`, by pointer), as does every other part of the code that needs one
(tests/fleet/test_defaults.py fails on a default written here, or anywhere in the core, that differs).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any, TypeVar

from fleetllm.core.fleet.jsonvalue import EMPTY, Frozen
from fleetllm.core.fleet.schema import schema_defaults

DEFAULTS: Mapping[str, Any] = MappingProxyType(schema_defaults("fleet"))  # fleet.yaml's, by JSON pointer
DEFAULT_LISTEN_PORTS: tuple[int, ...] = tuple(DEFAULTS["/listen_ports"])
DEFAULT_MAX_SERVERS: int = DEFAULTS["/max_servers_per_box"]


class ReconcileMode(StrEnum):
    ACTIVE = "active"
    PAUSED = "paused"


class RolloutMode(StrEnum):
    AUTO = "auto"  # boxes running the box agent are released new revisions box by box
    MANUAL = "manual"  # every box is served the newest valid commit; a person restarts it


DEFAULT_ROLLOUT_MODE = RolloutMode(DEFAULTS["/rollout/mode"])


class Provider(StrEnum):
    VAST = "vast"
    RUNPOD = "runpod"
    STATIC = "static"


@dataclass(frozen=True)
class ReconcileSettings:
    """fleet.yaml `reconcile:`, every default the schema's."""

    interval_s: int = DEFAULTS["/reconcile/interval_s"]
    health_grace_s: int = DEFAULTS["/reconcile/health_grace_s"]
    probe_timeout_s: float = float(DEFAULTS["/reconcile/probe_timeout_s"])
    probe_concurrency: int = DEFAULTS["/reconcile/probe_concurrency"]
    down_after_failures: int = DEFAULTS["/reconcile/down_after_failures"]
    up_after_successes: int = DEFAULTS["/reconcile/up_after_successes"]
    prune: bool = DEFAULTS["/reconcile/prune"]
    max_deletes_per_pass: int = DEFAULTS["/reconcile/max_deletes_per_pass"]
    max_delete_fraction: float = float(DEFAULTS["/reconcile/max_delete_fraction"])


@dataclass(frozen=True)
class RolloutSettings:
    """fleet.yaml `rollout:`, every default the schema's."""

    mode: RolloutMode = DEFAULT_ROLLOUT_MODE
    max_unavailable: int = DEFAULTS["/rollout/max_unavailable"]
    poll_s: int = DEFAULTS["/rollout/poll_s"]
    drain_s: int = DEFAULTS["/rollout/drain_s"]
    retire_s: int = DEFAULTS["/rollout/retire_s"]


@dataclass(frozen=True)
class Pool:
    """One capacity pool (fleet.yaml `capacity.pools.NAME`): identical rented boxes (fleetllm.core.capacity)."""

    name: str
    provider: Provider
    gpu: str  # the provider's GPU type: RunPod's GPU id ("NVIDIA H100 80GB HBM3"), Vast's gpu_name ("H100 SXM")
    gpus: int  # GPUs per box
    count: int  # boxes
    max_per_hour: float  # USD, per box
    image: str | None = None
    template: str | None = None  # RunPod templateId, Vast template_hash_id
    regions: tuple[str, ...] = ()  # RunPod dataCenterIds, Vast geolocation country codes
    disk_gb: int | None = None


@dataclass(frozen=True)
class CapacitySettings:
    """fleet.yaml `capacity:` (opt-in), every default the schema's; the fleet ceiling has none."""

    max_fleet_per_hour: float  # USD; the fleet's rented boxes, rentals included
    pools: Mapping[str, Pool] = field(default_factory=lambda: EMPTY_POOLS)
    max_rentals_per_pass: int = DEFAULTS["/capacity/max_rentals_per_pass"]
    max_terminations_per_pass: int = DEFAULTS["/capacity/max_terminations_per_pass"]


EMPTY_POOLS: Mapping[str, Pool] = MappingProxyType({})


@dataclass(frozen=True)
class FleetSettings:
    listen_ports: tuple[int, ...] = DEFAULT_LISTEN_PORTS
    max_servers_per_box: int = DEFAULT_MAX_SERVERS
    allow_empty_placement: bool = DEFAULTS["/allow_empty_placement"]
    legacy_servers: frozenset[tuple[str, int]] = frozenset()
    reconcile: ReconcileSettings = field(default_factory=ReconcileSettings)
    rollout: RolloutSettings = field(default_factory=RolloutSettings)
    capacity: CapacitySettings | None = None  # None: nothing declared, so nothing is ever rented or terminated
    fleet_id: str | None = None  # fleet.yaml fleet_id: every LiteLLM deployment of the fleet carries it

    def is_legacy(self, host: str, port: int) -> bool:
        return (host, port) in self.legacy_servers


@dataclass(frozen=True)
class VllmRecipe:
    """How to run one model (boot lifetime). Optional fields are None when the recipe omits them."""

    model: str
    served_model_name: str
    args: tuple[str, ...] = ()
    settings: Mapping[str, Frozen] = field(default_factory=lambda: EMPTY)
    max_model_len: int | None = None
    gpu_memory_utilization: float | None = None
    vram_gb: float | None = None
    disk_gb: float | None = None
    kv_bytes_per_token: int | None = None
    allow_options: frozenset[str] = frozenset()  # risky options it may use (fleetllm.core.fleet.options)


@dataclass(frozen=True)
class LitellmRoute:
    """The LiteLLM route for a model's deployments (live lifetime)."""

    params: Mapping[str, Frozen] = field(default_factory=lambda: EMPTY)
    model_info: Mapping[str, Frozen] = field(default_factory=lambda: EMPTY)


@dataclass(frozen=True)
class Recipe:
    name: str
    vllm: VllmRecipe
    litellm: LitellmRoute = field(default_factory=LitellmRoute)
    reconcile: ReconcileMode = ReconcileMode.ACTIVE
    health_grace_s: int | None = None
    description: str | None = None
    max_unavailable: int | None = None  # overrides fleet.yaml rollout.max_unavailable


@dataclass(frozen=True)
class ServerRow:
    """One placement row: a vLLM process on a box."""

    model: str  # catalog name
    port: int  # container listen port
    name: str  # process name: the row's third element, else the model name
    public_port: int | None = None  # deprecated: a public port written by hand


@dataclass(frozen=True)
class Box:
    name: str
    servers: tuple[ServerRow, ...]
    provider: Provider | None = None
    gpu_memory_gb: float | None = None
    gpus: int | None = None
    disk_gb: float | None = None
    notes: str | None = None
    reconcile: ReconcileMode = ReconcileMode.ACTIVE
    # The box gateway's public listen port. When set, every server row's port is a loopback port
    # behind the gateway, and LiteLLM reaches the box's models through this one port.
    gateway_port: int | None = None
    rollout: RolloutMode | None = None  # None: fleet.yaml rollout.mode

    @property
    def rented_from(self) -> Provider:
        """Where the box is rented: `provider:`, else static (the short form, `- [model, port]` rows)."""
        return self.provider or Provider.STATIC

    @property
    def card_gb(self) -> float | None:
        """One card's memory: placement.yaml's gpu_memory_gb is the box's total over its GPUs (what the
        stable division predicts a card's restarts from)."""
        return self.gpu_memory_gb / (self.gpus or 1) if self.gpu_memory_gb else None


@dataclass(frozen=True)
class Fleet:
    """A whole valid fleet repository at one revision."""

    revision: str
    settings: FleetSettings
    recipes: Mapping[str, Recipe]
    boxes: Mapping[str, Box]
    origin: str | None = None  # the repository's root commit: an existing fleet's derived id (judge.ownership)

    def box(self, name: str) -> Box | None:
        return self.boxes.get(name)

    def rollout_mode(self, box: str) -> RolloutMode:
        """The box's rollout mode: its placement override, else fleet.yaml's."""
        found = self.boxes.get(box)
        override = found.rollout if found is not None else None
        return override if override is not None else self.settings.rollout.mode

    def max_unavailable(self, model: str) -> int:
        """How many of a model's servers a rollout may take out at once."""
        recipe = self.recipes.get(model)
        override = recipe.max_unavailable if recipe is not None else None
        return override if override is not None else self.settings.rollout.max_unavailable

    @property
    def server_count(self) -> int:
        return sum(len(b.servers) for b in self.boxes.values())


K = TypeVar("K")
V = TypeVar("V")


def frozen_map(items: Mapping[K, V]) -> Mapping[K, V]:
    return MappingProxyType(dict(items))
