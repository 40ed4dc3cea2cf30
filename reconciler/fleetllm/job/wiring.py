"""Building a Reconciler from the config file: provider clients, the LiteLLM client, the store."""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import aiohttp

from fleetllm.adapters.litellm import LitellmApi, LitellmClient, LitellmError
from fleetllm.adapters.providers import ProviderClient, RunPodClient, VastClient
from fleetllm.adapters.state import open_reconcile_state
from fleetllm.adapters.state.reconcile import ReconcileState
from fleetllm.core.fleet.model import Provider, ReconcileSettings
from fleetllm.core.fleet.render import Bearers
from fleetllm.core.judge.intended import DeploymentSpec
from fleetllm.core.judge.observed import Deployment
from fleetllm.job.configfile import JobConfig
from fleetllm.job.engine import Reconciler
from fleetllm.job.observer import Observer
from fleetllm.job.rollout import FleetAt, RolloutBackend, RolloutDriver

ROLLOUT_METHODS = ("current_rollout", "box_releases", "save_rollout", "latest_reports")


def provider_clients(config: JobConfig) -> dict[Provider, ProviderClient]:
    clients: dict[Provider, ProviderClient] = {}
    for provider, access in config.providers.items():
        clients[provider] = VastClient(access) if provider is Provider.VAST else RunPodClient(access)
    return clients


class NoLitellm:
    """No litellm section: every call fails, so a pass judges the servers and plans nothing."""

    def __init__(self, source: str) -> None:
        self.why = f"no LiteLLM configured: {source} has no litellm section (url, master_key)"

    async def list_deployments(self) -> tuple[Deployment, ...]:
        raise LitellmError(self.why)

    async def get(self, deployment_id: str) -> Deployment | None:
        raise LitellmError(self.why)

    async def create(self, spec: DeploymentSpec) -> None:
        raise LitellmError(self.why)

    async def update(self, spec: DeploymentSpec) -> None:
        raise LitellmError(self.why)

    async def delete(self, deployment_id: str) -> bool:
        raise LitellmError(self.why)


def litellm_factory(config: JobConfig) -> Callable[[aiohttp.ClientSession], LitellmApi]:
    def make(session: aiohttp.ClientSession) -> LitellmApi:
        if config.litellm_url is None or config.litellm_master_key is None:
            return NoLitellm(config.source)
        return LitellmClient(session, config.litellm_url, config.litellm_master_key, config.litellm_timeout_s)
    return make


def build_reconciler(config: JobConfig, settings: ReconcileSettings,
                     store: ReconcileState | None = None) -> Reconciler:
    observer = Observer(provider_clients(config), settings.probe_timeout_s, settings.probe_concurrency,
                        boxes_route=config.litellm_url is None)  # no LiteLLM configured: the boxes route
    legacy = config.legacy_key.reveal() if config.legacy_key is not None else None  # into rendered bearers
    return Reconciler(Bearers(config.salt, legacy, config.previous_salt), observer, litellm_factory(config),
                      store if store is not None else open_reconcile_state(config.state_url, config.state_password),
                      config.write_concurrency)


def rollout_driver(store: object, fleet_at: FleetAt, bearers: Bearers) -> RolloutDriver | None:
    """The staged rollout over a state store that keeps rollouts (SQLite, PostgreSQL); None for one that
    does not (`memory:`): every box is then served and judged by the head, as before."""
    if not all(callable(getattr(store, name, None)) for name in ROLLOUT_METHODS):
        return None
    return RolloutDriver(cast(RolloutBackend, store), fleet_at, bearers)
