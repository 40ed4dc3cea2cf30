"""One pass's observation: provider listings and the LiteLLM listing concurrently, then every server
probed through a bounded pool, plus the control plane's records of each box from the state store."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import aiohttp

from fleetllm.adapters.http import HttpError
from fleetllm.adapters.litellm import LitellmApi, LitellmError
from fleetllm.adapters.probe import in_flight, probe
from fleetllm.adapters.providers import ProviderClient
from fleetllm.core.fleet.model import DEFAULTS, Provider
from fleetllm.core.judge.intended import Endpoint, Intended, IntendedServer
from fleetllm.core.judge.observed import (
    BoxFacts,
    Deployment,
    Observation,
    ProbeResult,
    ProbeStatus,
    ProviderListing,
    Resolution,
    resolve_endpoint,
)
from fleetllm.core.judge.ownership import claim_of, writable

BearerFor = Callable[[str, int], str | None]  # (box, listen port) -> bearer, for orphan probes


@dataclass
class Observer:
    providers: Mapping[Provider, ProviderClient]
    probe_timeout_s: float = float(DEFAULTS["/reconcile/probe_timeout_s"])  # fleet.yaml's, as a pass passes them
    probe_concurrency: int = DEFAULTS["/reconcile/probe_concurrency"]
    clock: Callable[[], float] = field(default=time.time)
    boxes_route: bool = False  # no LiteLLM configured: not listed; each serving server's requests in flight read

    async def observe(self, session: aiohttp.ClientSession, intended: Intended, api: LitellmApi,
                      boxes: Mapping[str, BoxFacts], bearer_for: BearerFor | None = None) -> Observation:
        observed_at = self.clock()
        started = time.perf_counter()
        # A provider without a key is not listed: its boxes are dialled at their listen ports (box contract).
        used = {s.provider for s in intended.servers.values() if s.provider in self.providers}
        listing_tasks = {p: asyncio.ensure_future(self._listing(session, p)) for p in sorted(used)}
        deployments_task = asyncio.ensure_future(self._deployments(api) if not self.boxes_route else _unlisted())
        listings = {p: await t for p, t in listing_tasks.items()}
        deployments, litellm_error = await deployments_task
        listed = time.perf_counter()

        resolutions = {key: resolve_endpoint(s, listings) for key, s in intended.servers.items()}
        gate = asyncio.Semaphore(self.probe_concurrency)
        probe_tasks = {key: asyncio.ensure_future(self._probe(session, gate, intended.servers[key], res))
                       for key, res in resolutions.items() if res.unknown is None and res.listed}
        orphan_tasks = {d.id: asyncio.ensure_future(self._probe_orphan(session, gate, d, bearer_for))
                        for d in _orphans(intended, deployments) if bearer_for is not None}
        probes = {key: await t for key, t in probe_tasks.items()}
        counts: dict[tuple[str, int], int] = {}
        if self.boxes_route:  # what a rollout's drain waits for without LiteLLM
            count_tasks = {key: asyncio.ensure_future(self._in_flight(session, gate, intended.servers[key],
                                                                      resolutions[key]))
                           for key, result in probes.items() if result.status is ProbeStatus.OK}
            counts = {key: n for key, t in count_tasks.items() if (n := await t) is not None}
        orphans = {i: r for i, t in orphan_tasks.items() if (r := await t) is not None}
        durations = {"listings_s": round(listed - started, 3), "probes_s": round(time.perf_counter() - listed, 3)}
        return Observation(observed_at, listings, resolutions, probes, deployments, litellm_error,
                           dict(boxes), orphans, durations, boxes_route=self.boxes_route, in_flight=counts)

    async def _listing(self, session: aiohttp.ClientSession, provider: Provider) -> ProviderListing:
        client = self.providers.get(provider)
        if client is None:
            return ProviderListing(provider, error=f"no {provider} provider configured (providers.{provider})")
        return await client.list(session)

    @staticmethod
    async def _deployments(api: LitellmApi) -> tuple[tuple[Deployment, ...] | None, str | None]:
        try:
            return await api.list_deployments(), None
        except (HttpError, LitellmError) as exc:
            return None, str(exc)

    async def _in_flight(self, session: aiohttp.ClientSession, gate: asyncio.Semaphore, server: IntendedServer,
                         resolution: Resolution) -> int | None:
        if resolution.endpoint is None:
            return None
        async with gate:
            return await in_flight(session, resolution.endpoint, server.bearer, server.served_model_name,
                                   self.probe_timeout_s, via_gateway=server.gateway_port is not None)

    async def _probe(self, session: aiohttp.ClientSession, gate: asyncio.Semaphore, server: IntendedServer,
                     resolution: Resolution) -> ProbeResult:
        if resolution.endpoint is None:
            return ProbeResult(ProbeStatus.NO_ENDPOINT, f"no public port for listen port {server.port} yet")
        async with gate:
            result = await probe(session, resolution.endpoint, server.bearer, server.served_model_name,
                                 self.probe_timeout_s, via_gateway=server.gateway_port is not None)
            if result.status is not ProbeStatus.UNAUTHORIZED or server.previous_bearer is None:
                return result
            older = await probe(session, resolution.endpoint, server.previous_bearer, server.served_model_name,
                                self.probe_timeout_s, via_gateway=server.gateway_port is not None)
            return dataclasses.replace(older, previous_salt=True) if older.status is ProbeStatus.OK else result

    async def _probe_orphan(self, session: aiohttp.ClientSession, gate: asyncio.Semaphore, deployment: Deployment,
                            bearer_for: BearerFor | None) -> ProbeResult | None:
        """Does a removed server still serve? (Its deployment is then kept until a replacement serves.)"""
        key, base, name = deployment.recorded_key, deployment.recorded_api_base, deployment.recorded_served_name
        endpoint = _endpoint_of(base)
        gateway = deployment.recorded_gateway_port
        bearer = (bearer_for(key[0], gateway if gateway is not None else key[1])
                  if bearer_for is not None and key is not None else None)
        if endpoint is None or bearer is None or name is None:
            return None
        async with gate:
            return await probe(session, endpoint, bearer, name, self.probe_timeout_s, via_gateway=gateway is not None)


NOT_LISTED = ("no LiteLLM: the control plane's config has no litellm section, so the boxes route (their "
              "gateway, or a balancer in front of them) and the rollout restarts them without LiteLLM")


async def _unlisted() -> tuple[tuple[Deployment, ...] | None, str | None]:
    return None, NOT_LISTED


def _orphans(intended: Intended, deployments: tuple[Deployment, ...] | None) -> list[Deployment]:
    """This fleet's deployments of servers it no longer intends. Another fleet's are never probed (the
    probe would send this fleet's bearer to that fleet's server); a fleet whose id is derived later in the
    pass (no fleet_id in fleet.yaml) cannot tell yet and probes every marked one."""
    ids = {s.id for s in intended.servers.values()}
    claim = claim_of(intended)
    return [d for d in deployments or () if d.managed and d.id not in ids
            and (intended.fleet_id is None or writable(d, claim))]


def _endpoint_of(api_base: str | None) -> Endpoint | None:
    if not api_base:
        return None
    parts = urlsplit(api_base)
    if parts.hostname is None or parts.port is None:
        return None
    return Endpoint(parts.hostname, parts.port)


