"""What one pass observed: provider listings, probes, LiteLLM's deployments, the control plane's
records of each box. Plain immutable data; the adapters in `observe/` produce it, the judge and the
planner read it."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType

from fleetllm.core.boxreport import BoxReport
from fleetllm.core.cost import BoxPrice
from fleetllm.core.fleet.jsonvalue import EMPTY, Frozen
from fleetllm.core.fleet.model import Provider
from fleetllm.core.judge.intended import (
    INFO_API_BASE,
    INFO_BEARER,
    INFO_BOX,
    INFO_GATEWAY,
    INFO_PARAMS,
    INFO_PORT,
    INFO_SERVED,
    INFO_SPEC,
    MANAGED_BY,
    Endpoint,
    IntendedServer,
    ServerKey,
)


class ProbeStatus(StrEnum):
    OK = "ok"  # /v1/models with our bearer lists the served name
    WRONG_MODEL = "wrong-model"  # our bearer works but the name is not listed
    UNAUTHORIZED = "unauthorized"  # 401/403 with our bearer
    BAD_REPLY = "bad-reply"  # answers, but not vLLM's shapes
    UNHEALTHY = "unhealthy"  # /health answers non-200 (engine dead)
    REFUSED = "refused"  # connection refused or reset: vLLM binds only after loading
    TIMEOUT = "timeout"  # no answer within the probe timeout
    NO_ENDPOINT = "no-endpoint"  # the provider lists the box but no public port for this listen port yet
    ERROR = "error"  # our own side failed (DNS, local resources): says nothing about the server


FAILED_PROBES = frozenset({ProbeStatus.UNHEALTHY, ProbeStatus.REFUSED, ProbeStatus.TIMEOUT,
                           ProbeStatus.NO_ENDPOINT})
FOREIGN_PROBES = frozenset({ProbeStatus.WRONG_MODEL, ProbeStatus.UNAUTHORIZED, ProbeStatus.BAD_REPLY})


@dataclass(frozen=True)
class ProbeResult:
    status: ProbeStatus
    detail: str = ""
    served_names: tuple[str, ...] = ()
    max_model_len: int | None = None
    root: str | None = None
    gateway_models: int | None = None  # behind a box gateway: the model count its own /health reports
    previous_salt: bool = False  # it refused the bearer and accepted the previous salt's (a rotation in progress)


@dataclass(frozen=True)
class ProviderBox:
    """One box as its provider lists it. `endpoints` maps listen port -> public endpoint."""

    box: str
    endpoints: Mapping[int, Endpoint] = field(default_factory=lambda: MappingProxyType({}))
    status: str = "running"
    ident: str = ""  # the provider's own id (Vast instance id, RunPod pod id)
    ambiguous: str | None = None  # why this box cannot be told apart (shared IP, ...)
    price: float | None = None  # what the provider bills for it, USD per hour (Vast dph_total, RunPod costPerHr)
    gpu: str = ""  # the GPU type as the provider names it ("H100 80GB HBM3", "RTX 4090")
    gpus: int | None = None  # how many of them
    label: str = ""  # the provider's name for it (RunPod pod name, Vast instance label): a rental's pool label


@dataclass(frozen=True)
class ProviderListing:
    provider: Provider
    boxes: Mapping[str, ProviderBox] = field(default_factory=lambda: MappingProxyType({}))
    error: str | None = None  # the listing failed: nothing about its boxes is known
    # every instance or pod whose label is a capacity pool's (`fleetllm-POOL-N`), by its provider id, addressed
    # or not yet (a Vast instance has no public IP while it loads): what fleetllm.core.capacity plans from
    rentals: Mapping[str, ProviderBox] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def ok(self) -> bool:
        return self.error is None

    def prices(self) -> dict[str, BoxPrice]:
        """Every listed box with a price, by box name (a failed listing prices nothing; an ambiguous box,
        whose instance is not known, neither)."""
        if not self.ok:
            return {}
        return {name: BoxPrice(name, self.provider, box.price, box.gpu, box.gpus)
                for name, box in self.boxes.items() if box.price is not None and box.ambiguous is None}


def listing_prices(listings: Mapping[Provider, ProviderListing]) -> dict[str, BoxPrice]:
    """The priced boxes of every listing, by box name."""
    return {name: price for _, listing in sorted(listings.items()) for name, price in listing.prices().items()}


@dataclass(frozen=True)
class Deployment:
    """A deployment as LiteLLM lists it (`api_key` is never returned)."""

    id: str
    model_name: str
    model_info: Mapping[str, Frozen] = field(default_factory=lambda: EMPTY)
    api_base: str | None = None
    db_model: bool = True

    @property
    def managed(self) -> bool:
        return self.model_info.get("managed_by") == MANAGED_BY

    @property
    def spec(self) -> str | None:
        value = self.model_info.get(INFO_SPEC)
        return value if isinstance(value, str) else None

    def info_str(self, key: str) -> str | None:
        value = self.model_info.get(key)
        return value if isinstance(value, str) else None

    @property
    def recorded_api_base(self) -> str | None:
        return self.info_str(INFO_API_BASE) or self.api_base

    @property
    def recorded_bearer(self) -> str | None:
        return self.info_str(INFO_BEARER)

    @property
    def recorded_served_name(self) -> str | None:
        return self.info_str(INFO_SERVED)

    @property
    def recorded_params(self) -> frozenset[str]:
        value = self.model_info.get(INFO_PARAMS)
        return frozenset(v for v in value if isinstance(v, str)) if isinstance(value, tuple) else frozenset()

    @property
    def recorded_gateway_port(self) -> int | None:
        value = self.model_info.get(INFO_GATEWAY)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    @property
    def recorded_key(self) -> ServerKey | None:
        box, port = self.model_info.get(INFO_BOX), self.model_info.get(INFO_PORT)
        if isinstance(box, str) and isinstance(port, int) and not isinstance(port, bool):
            return (box, port)
        return None


@dataclass(frozen=True)
class BoxFacts:
    fetched_at: float | None = None  # last time the box fetched its config
    report: BoxReport | None = None  # its latest report (fleetllm.core.boxreport)


@dataclass(frozen=True)
class Resolution:
    """Where to dial a server, or why we cannot."""

    endpoint: Endpoint | None
    listed: bool = True  # False: a working listing does not have the box (Missing)
    unknown: str | None = None  # our observation of the box failed (listing down, ambiguous)
    note: str = ""  # e.g. "Vast instance 312 is loading"
    assumed: bool = False  # no key for the box's provider: public port = listen port, as the box contract says


def assumed_mapping(provider: Provider) -> str:
    return (f"no {provider} key configured (providers.{provider}): public port assumed = listen port, as the "
            "box contract says; configure the key if the provider maps ports")


def _dialable(box: str) -> bool:
    """An IP address or a dotted host name; a bare id (a RunPod pod id) is not an address."""
    try:
        ipaddress.ip_address(box)
    except ValueError:
        return "." in box
    return True


def resolve_endpoint(server: IntendedServer, listings: Mapping[Provider, ProviderListing]) -> Resolution:
    """Pure: the public endpoint of a server from its provider's listing."""
    if server.provider is Provider.STATIC:
        return Resolution(Endpoint(server.box, server.pinned_public_port or server.dial_port))
    listing = listings.get(server.provider)
    if listing is None:  # "Without a GPU provider key configured, public equals listen."
        if not _dialable(server.box):
            return Resolution(None, unknown=f"no {server.provider} key configured (providers.{server.provider}), and "
                                            f"the box's name {server.box} is not an address (a pod id): it cannot "
                                            "be dialled without the provider's listing; configure the key")
        return Resolution(Endpoint(server.box, server.pinned_public_port or server.dial_port),
                          note=assumed_mapping(server.provider), assumed=True)
    if not listing.ok:
        return Resolution(None, unknown=f"the {server.provider} listing failed: {listing.error}")
    listed = listing.boxes.get(server.box)
    if listed is None:
        return Resolution(None, listed=False)
    if listed.ambiguous:
        return Resolution(None, unknown=listed.ambiguous)
    note = f"{server.provider} {listed.ident} is {listed.status}".replace("  ", " ")
    if server.pinned_public_port is not None:
        host = next(iter(listed.endpoints.values())).host if listed.endpoints else server.box
        return Resolution(Endpoint(host, server.pinned_public_port), note=note)
    return Resolution(listed.endpoints.get(server.dial_port), note=note)


@dataclass(frozen=True)
class Observation:
    observed_at: float
    listings: Mapping[Provider, ProviderListing]
    resolutions: Mapping[ServerKey, Resolution]
    probes: Mapping[ServerKey, ProbeResult]
    deployments: tuple[Deployment, ...] | None  # None: the LiteLLM listing failed
    litellm_error: str | None = None
    boxes: Mapping[str, BoxFacts] = field(default_factory=lambda: MappingProxyType({}))
    orphan_probes: Mapping[str, ProbeResult] = field(default_factory=lambda: MappingProxyType({}))
    durations: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))  # seconds per phase
    # No LiteLLM configured: the boxes route (their gateway, an outside balancer); LiteLLM is not listed
    # and that is no failure. `in_flight`: each serving server's requests in flight or queued (absent: unknown).
    boxes_route: bool = False
    in_flight: Mapping[ServerKey, int] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def failed_listings(self) -> list[str]:
        failed = [f"{p} listing: {lst.error}" for p, lst in sorted(self.listings.items()) if not lst.ok]
        if self.deployments is None and not self.boxes_route:
            failed.append(f"LiteLLM listing: {self.litellm_error}")
        return failed
