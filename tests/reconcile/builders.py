"""Small builders for the pure-core tests: an intended state, observations, deployments."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

from fleetllm.core.boxreport import BoxReport
from fleetllm.core.fleet.bearer import Salt
from fleetllm.core.fleet.jsonvalue import freeze_mapping
from fleetllm.core.fleet.model import LitellmRoute, Provider, ReconcileSettings
from fleetllm.core.judge.assess import Assessment, assess
from fleetllm.core.judge.intended import (
    Endpoint,
    Intended,
    IntendedServer,
    ServerKey,
    desired_deployment,
)
from fleetllm.core.judge.observed import (
    BoxFacts,
    Deployment,
    Observation,
    ProbeResult,
    ProbeStatus,
    ProviderListing,
    resolve_endpoint,
)
from fleetllm.core.judge.verdict import ServerHistory
from fleetllm_contract.report import ReportOutcome

SALT = Salt("test-salt-0123456789abcdef")
NOW = 1_800_000_000.0
SETTINGS = ReconcileSettings(health_grace_s=600, down_after_failures=3, up_after_successes=2,
                             max_deletes_per_pass=10, max_delete_fraction=0.5)


def server(box: str, port: int, model: str = "m", *, provider: Provider = Provider.STATIC, paused: bool = False,
           max_model_len: int | None = 4096, params: Mapping[str, object] | None = None,
           salt: Salt = SALT) -> IntendedServer:
    return IntendedServer(
        box=box, port=port, name=model, model=model, served_model_name=model, weights=f"org/{model}",
        max_model_len=max_model_len, digest=f"sha256:{box}:{port}:{model}", bearer=salt.derive(box, port),
        provider=provider, paused=paused, health_grace_s=SETTINGS.health_grace_s,
        route=LitellmRoute(params=freeze_mapping(dict(params or {})),  # type: ignore[arg-type]
                           model_info=freeze_mapping({"context_window": 4096})))


def intended(servers: Iterable[IntendedServer], settings: ReconcileSettings = SETTINGS,
             revision: str = "a" * 40) -> Intended:
    return Intended(revision, settings, {s.key: s for s in servers})


def ok(s: IntendedServer, **changes: object) -> ProbeResult:
    result = ProbeResult(ProbeStatus.OK, f"lists {s.served_model_name}", (s.served_model_name,), s.max_model_len,
                         s.weights)
    return dataclasses.replace(result, **changes)  # type: ignore[arg-type]


def failed(status: ProbeStatus = ProbeStatus.REFUSED) -> ProbeResult:
    return ProbeResult(status, f"GET /health: {status}")


def deployment_for(s: IntendedServer, endpoint: Endpoint | None = None, revision: str = "a" * 40) -> Deployment:
    """The deployment LiteLLM would list after we created it for `s`."""
    spec = desired_deployment(s, endpoint or Endpoint(s.box, s.port), revision)
    return Deployment(spec.id, spec.model_name, spec.model_info, spec.api_base)


def unmanaged(ident: str, model: str = "other", api_base: str = "http://198.51.100.1:9000/v1") -> Deployment:
    return Deployment(ident, model, freeze_mapping({"id": ident}), api_base)


def observation(plan_for: Intended, probes: Mapping[ServerKey, ProbeResult], deployments: Iterable[Deployment] | None,
                *, listings: Mapping[Provider, ProviderListing] | None = None,
                facts: Mapping[str, BoxFacts] | None = None, now: float = NOW,
                orphan_probes: Mapping[str, ProbeResult] | None = None) -> Observation:
    listings = dict(listings or {})
    resolutions = {k: resolve_endpoint(s, listings) for k, s in plan_for.servers.items()}
    return Observation(now, listings, resolutions, dict(probes),
                       None if deployments is None else tuple(deployments),
                       None if deployments is not None else "LiteLLM GET /v2/model/info: HTTP 503",
                       dict(facts or {}), dict(orphan_probes or {}))


def assessed(plan_for: Intended, obs: Observation,
             histories: Mapping[ServerKey, ServerHistory] | None = None) -> Assessment:
    return assess(plan_for, obs, histories or {})


def up_history(now: float = NOW - 60) -> ServerHistory:
    return ServerHistory(first_seen=now - 3600, up=True, ever_up=True, ok_streak=5, recent="11111", last_healthy=now)


def reported(revision: str, digests: Mapping[str, str], at: float, *, failed: Iterable[str] = (),
             outcome: ReportOutcome = ReportOutcome.INSTALLED, box: str = "127.0.0.2") -> BoxReport:
    """A box's report (POST /vllm/report) of the servers in `digests` (name -> boot digest it applied);
    `failed`: servers it says supervisord gave up on (one not in `digests` is reported without a digest)."""
    gave_up = set(failed)
    servers: list[dict[str, object]] = [{"name": name, "digest": digest, "state": "failed" if name in gave_up
                                         else "started"} for name, digest in digests.items()]
    servers += [{"name": name, "state": "failed"} for name in sorted(gave_up - set(digests))]
    return BoxReport(box, at, box, revision, "test", outcome, freeze_mapping({"servers": servers}))
