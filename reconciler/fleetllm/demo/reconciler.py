"""The demo's reconciler: the shipped one (fleetllm.job.runner.PassRunner), over the control plane's
config and state store, each pass the one `fleetllm reconcile`'s loop runs (`scheduled_pass`: the tracked
branch's newest valid commit, the lock, then the operator controls, the pin, the suspension, the dry run,
the record, the metrics and the notifications). The demo has no pass of its own: only these seams.

With a LiteLLM proxy a pass applies its plan. Without one the demo runs what `fleetllm reconcile` runs
for a fleet with no litellm section: real passes in which the boxes route (each box's own servers, a
balancer in front of them), so a commit rolls out box by box (health-gated make-before-break, a drain
that waits for the requests in flight) and LiteLLM is neither listed nor written.

A rollout scenario without a proxy applies its passes to a routing table kept in the demo's memory
(`MemoryLitellm`: nothing is sent anywhere, no caller can use it), so its drains and routes play out as
they would with LiteLLM.
"""

from __future__ import annotations

import logging

from fleetllm.adapters.litellm import LitellmApi
from fleetllm.core.judge.intended import DeploymentSpec
from fleetllm.core.judge.observed import Deployment
from fleetllm.demo.litellm import Litellm
from fleetllm.demo.workspace import Workspace
from fleetllm.job.configfile import load_config
from fleetllm.job.runner import PassRunner, RunnerOptions
from fleetllm.logs import get_logger, log_event

LOG = get_logger("demo")


class MemoryLitellm:
    """LiteLLM's deployment table in memory: what a rollout scenario without a proxy applies to."""

    def __init__(self) -> None:
        self.table: dict[str, Deployment] = {}

    async def list_deployments(self) -> tuple[Deployment, ...]:
        return tuple(self.table.values())

    async def get(self, deployment_id: str) -> Deployment | None:
        return self.table.get(deployment_id)

    async def create(self, spec: DeploymentSpec) -> None:
        self.table[spec.id] = Deployment(spec.id, spec.model_name, spec.model_info, spec.api_base)

    async def update(self, spec: DeploymentSpec) -> None:
        await self.create(spec)

    async def delete(self, deployment_id: str) -> bool:
        return self.table.pop(deployment_id, None) is not None


def options(litellm: Litellm | None, *, rollouts: bool) -> RunnerOptions:
    """The runner's options for the demo: with a proxy, or without one outside a scenario, the config's
    (what `fleetllm reconcile --config` does; no litellm section: the boxes route); a rollout scenario
    without a proxy, the table in memory."""
    if litellm is not None or not rollouts:
        return RunnerOptions(command="demo")
    memory: LitellmApi = MemoryLitellm()
    return RunnerOptions(command="demo", litellm=lambda _session: memory)


def reconciler(workspace: Workspace, litellm: Litellm | None, *, rollouts: bool) -> PassRunner:
    """The runner over exactly what `fleetllm reconcile --config` reads (the control plane's config: the
    fleet repository at its branch, the state store). The demo says what a pass found in its own words
    (Demo.tick: the invalid head once per commit); what the runner says every pass (on stderr in
    `fleetllm reconcile`) goes to the demo's log instead of across its live display."""
    def say(text: str) -> None:
        log_event(LOG, "reconciler_says", logging.WARNING, text=text)

    return PassRunner(options(litellm, rollouts=rollouts), load_config(workspace.config), say=say)
