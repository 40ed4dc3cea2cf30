"""The intended state: one entry per server of the last valid commit, and the LiteLLM deployment each
server should have once it serves.

A deployment's identity is deterministic, `fleetllm:<box>:<listen port>` (no `/`: LiteLLM puts the id in
a URL path), so a pass that crashed half-way or ran twice can never create a duplicate. Ownership and
provenance sit in `model_info`: the `managed_by` marker and the fleet's id (core.judge.ownership), the
revision that last wrote it, the bearer's fingerprint (LiteLLM never returns `api_key`) and a digest of
everything the deployment should carry, which is what tells the planner that an update is due.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field

from fleetllm.core.fleet.bearer import bearer_fingerprint
from fleetllm.core.fleet.jsonvalue import JSON, Frozen, canonical_json, freeze_mapping, thaw
from fleetllm.core.fleet.model import DEFAULTS, Fleet, LitellmRoute, Provider, ReconcileMode, ReconcileSettings
from fleetllm.core.fleet.render import Bearers, server_entry

MANAGED_BY = "fleetllm"
ID_PREFIX = "fleetllm"
# Our own model_info keys. Recipe extras may not override them (they are set last).
INFO_BOX, INFO_PORT, INFO_SERVER = "fleetllm_box", "fleetllm_port", "fleetllm_server"
INFO_REVISION, INFO_API_BASE = "fleetllm_revision", "fleetllm_api_base"
INFO_BEARER, INFO_SPEC, INFO_SERVED = "fleetllm_bearer_fingerprint", "fleetllm_spec", "fleetllm_served_name"
INFO_PARAMS = "fleetllm_params"  # the litellm_params keys we wrote: PATCH merges, so a removed key needs a replace
INFO_GATEWAY = "fleetllm_gateway_port"  # set when LiteLLM reaches the server through its box gateway
INFO_FLEET = "fleetllm_fleet"  # the owning fleet's id (fleet.yaml fleet_id; core.judge.ownership reads it)

ServerKey = tuple[str, int]  # (box, listen port)


def deployment_id(box: str, port: int) -> str:
    return f"{ID_PREFIX}:{box}:{port}"


@dataclass(frozen=True)
class Endpoint:
    """Where the reconciler and LiteLLM dial a server: the public address and port."""

    host: str
    port: int

    def url(self, path: str = "") -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}{path}"

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class IntendedServer:
    box: str
    port: int  # the listen port
    name: str  # the process name
    model: str  # catalog name: LiteLLM's model_name
    served_model_name: str  # the id vLLM lists on /v1/models
    weights: str  # the HF id: vLLM's `root`
    max_model_len: int | None
    digest: str  # boot digest of the rendered box JSON entry (what the box reports back)
    bearer: str = field(repr=False)
    provider: Provider = Provider.STATIC
    pinned_public_port: int | None = None  # deprecated hand-written public port
    paused: bool = False
    health_grace_s: int = DEFAULTS["/reconcile/health_grace_s"]
    route: LitellmRoute = field(default_factory=LitellmRoute)
    # On a box with a gateway, the gateway's listen port: LiteLLM and the probes reach this server
    # through it (`bearer` is then the gateway's), and `port` is the server's loopback port behind it.
    gateway_port: int | None = None
    gateway_models: int | None = None  # how many models the placement puts behind that gateway
    # During a box-by-box salt rotation: the bearer of the previous salt, tried when the server refuses
    # `bearer` (its box has not restarted yet).
    previous_bearer: str | None = field(default=None, repr=False)

    @property
    def dial_port(self) -> int:
        """The listen port the provider publishes for this server: its own, or its box gateway's."""
        return self.gateway_port if self.gateway_port is not None else self.port

    @property
    def key(self) -> ServerKey:
        return (self.box, self.port)

    @property
    def id(self) -> str:
        return deployment_id(self.box, self.port)

    @property
    def bearer_fingerprint(self) -> str:
        return bearer_fingerprint(self.bearer)

    def __str__(self) -> str:
        return f"{self.box}:{self.port} {self.model}"


@dataclass(frozen=True)
class Intended:
    revision: str
    settings: ReconcileSettings
    servers: Mapping[ServerKey, IntendedServer]
    fleet_id: str | None = None  # fleet.yaml's, or the one a pass derives (core.judge.ownership.fleet_identity)
    fleet_boxes: frozenset[str] = frozenset()  # every box of the fleet, held out or not: what it may claim

    def by_model(self, model: str) -> list[IntendedServer]:
        return [s for s in self.servers.values() if s.model == model]


def intended_state(fleet: Fleet, bearers: Bearers) -> Intended:
    """Raises RenderError when a server's bearer cannot be made (a legacy pair without the legacy key):
    a pass must not run on a partial intended state, or it would prune what it could not render."""
    servers: dict[ServerKey, IntendedServer] = {}
    grace = fleet.settings.reconcile.health_grace_s
    for box in fleet.boxes.values():
        behind = (len({fleet.recipes[row.model].vllm.served_model_name for row in box.servers})
                  if box.gateway_port is not None else None)
        for row in box.servers:
            recipe = fleet.recipes[row.model]
            bearer = bearers.for_server(fleet, box.name, row)
            entry = server_entry(fleet, box, row, bearer)
            previous = bearers.previous_for(fleet, box.name, row.port)
            if box.gateway_port is not None:  # callers present the gateway's bearer; it holds the server's
                bearer = bearers.salt.derive(box.name, box.gateway_port)
                previous = bearers.previous_for(fleet, box.name, box.gateway_port)
            servers[(box.name, row.port)] = IntendedServer(
                box=box.name, port=row.port, name=row.name, model=row.model,
                served_model_name=recipe.vllm.served_model_name, weights=recipe.vllm.model,
                max_model_len=recipe.vllm.max_model_len, digest=str(entry["digest"]), bearer=bearer,
                provider=box.rented_from, pinned_public_port=row.public_port,
                paused=box.reconcile is ReconcileMode.PAUSED or recipe.reconcile is ReconcileMode.PAUSED,
                health_grace_s=recipe.health_grace_s if recipe.health_grace_s is not None else grace,
                route=recipe.litellm, gateway_port=box.gateway_port, gateway_models=behind,
                previous_bearer=previous)
    return Intended(fleet.revision, fleet.settings.reconcile, servers, fleet.settings.fleet_id,
                    frozenset(fleet.boxes))


@dataclass(frozen=True)
class DeploymentSpec:
    """The deployment a serving server should have in LiteLLM (`/model/new` and PATCH bodies)."""

    id: str
    model_name: str
    litellm_params: Mapping[str, Frozen] = field(repr=False)  # holds api_key
    model_info: Mapping[str, Frozen]

    @property
    def spec(self) -> str:
        return str(self.model_info[INFO_SPEC])

    @property
    def api_base(self) -> str:
        return str(self.model_info[INFO_API_BASE])

    def body(self) -> dict[str, JSON]:
        return {"model_name": self.model_name, "litellm_params": thaw(self.litellm_params),
                "model_info": thaw(self.model_info)}


def desired_deployment(server: IntendedServer, endpoint: Endpoint, revision: str,
                       fleet_id: str | None = None) -> DeploymentSpec:
    api_base = endpoint.url("/v1")  # LiteLLM appends only /chat/completions
    params: dict[str, JSON] = {"model": f"hosted_vllm/{server.served_model_name}"}
    params.update(thaw(server.route.params))  # type: ignore[arg-type]
    params["api_base"] = api_base
    info: dict[str, JSON] = dict(thaw(server.route.model_info))  # type: ignore[arg-type]
    info.update({
        "id": server.id, "managed_by": MANAGED_BY, INFO_BOX: server.box, INFO_PORT: server.port,
        INFO_SERVER: server.name, INFO_SERVED: server.served_model_name, INFO_API_BASE: api_base,
        INFO_BEARER: server.bearer_fingerprint, INFO_PARAMS: list[JSON](sorted([*params, "api_key"])),
    })
    if server.gateway_port is not None:
        info[INFO_GATEWAY] = server.gateway_port
    if fleet_id is not None:
        info[INFO_FLEET] = fleet_id
    # The spec digest covers everything we write except provenance (revision) and the bearer itself
    # (its fingerprint is in `info`): a new commit that changes nothing for this server updates nothing.
    digest_input: dict[str, JSON] = {"model_name": server.model, "litellm_params": dict(params),
                    "model_info": info}
    info[INFO_SPEC] = "sha256:" + hashlib.sha256(canonical_json(digest_input).encode()).hexdigest()[:32]
    info[INFO_REVISION] = revision
    params["api_key"] = server.bearer
    return DeploymentSpec(server.id, server.model, freeze_mapping(params), freeze_mapping(info))
