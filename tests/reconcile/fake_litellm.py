"""An in-memory LiteLLM model API with LiteLLM's observed semantics (../shared/reference/litellm.md):
a duplicate id fails, PATCH merges litellm_params, a delete of a missing id answers "not found". With
`fail_rate`, calls fail at random, some of them after the write took effect (a lost answer)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from fleetllm.adapters.litellm import LitellmError
from fleetllm.core.judge.intended import DeploymentSpec
from fleetllm.core.judge.observed import Deployment


@dataclass
class FakeLitellm:
    rows: dict[str, Deployment] = field(default_factory=dict)
    fail_rate: float = 0.0
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    writes: list[tuple[str, str]] = field(default_factory=list)
    duplicate_creates: int = 0
    list_fails: bool = False

    def _maybe_fail(self, what: str) -> bool:
        """True: fail after the write (lost answer). Raises: fail before."""
        roll = self.rng.random()
        if roll < self.fail_rate / 2:
            raise LitellmError(f"{what}: HTTP 503 (injected)")
        return roll < self.fail_rate

    async def list_deployments(self) -> tuple[Deployment, ...]:
        if self.list_fails:
            raise LitellmError("LiteLLM GET /v2/model/info: HTTP 503")
        return tuple(self.rows.values())

    async def get(self, deployment_id: str) -> Deployment | None:
        self._maybe_fail("get")
        return self.rows.get(deployment_id)

    async def create(self, spec: DeploymentSpec) -> None:
        lost = self._maybe_fail("create")
        if spec.id in self.rows:
            self.duplicate_creates += 1
            raise LitellmError("Failed to add model to db (HTTP 500)")
        self.rows[spec.id] = Deployment(spec.id, spec.model_name, spec.model_info, spec.api_base)
        self.writes.append(("create", spec.id))
        if lost:
            raise LitellmError("create: no answer (injected)")

    async def update(self, spec: DeploymentSpec) -> None:
        lost = self._maybe_fail("update")
        if spec.id not in self.rows:
            raise LitellmError("update: not found")
        self.rows[spec.id] = Deployment(spec.id, spec.model_name, spec.model_info, spec.api_base)
        self.writes.append(("update", spec.id))
        if lost:
            raise LitellmError("update: no answer (injected)")

    async def delete(self, deployment_id: str) -> bool:
        lost = self._maybe_fail("delete")
        if deployment_id not in self.rows:
            return False
        del self.rows[deployment_id]
        self.writes.append(("delete", deployment_id))
        if lost:
            raise LitellmError("delete: no answer (injected)")
        return True
