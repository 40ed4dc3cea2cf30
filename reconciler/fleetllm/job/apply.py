"""Executing a plan: exactly its actions, creates/updates first, deletes last, with bounded concurrency.

Every action re-reads its deployment by id first, so an apply is idempotent and survives a crash
between any two actions (or a plan made from a stale observation): a create finds the row already
there and is done; an update of a row that vanished becomes a create; a delete of a row that is gone
is done; a row that is not this fleet's (core.judge.ownership: no marker, another fleet's id) is never
written. A failure is recorded and retried by the next
pass (failed deletes are kept as pending until the deployment is gone).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from fleetllm.adapters.http import HttpError
from fleetllm.adapters.litellm import LitellmApi, LitellmError
from fleetllm.core.judge.ownership import Claim, owner, writable
from fleetllm.core.judge.plan import Action, ActionKind, PendingDelete, Plan
from fleetllm.errors import OperationError


class ActionOutcome(StrEnum):
    """What writing one action to LiteLLM came to (pass records and the pages show the value)."""

    CREATED = "created"
    UPDATED = "updated"
    REPLACED = "replaced"
    DELETED = "deleted"
    ALREADY_PRESENT = "already present"
    ALREADY_GONE = "already gone"
    REFUSED = "refused"  # the row is not ours: never written
    FAILED = "failed"
    PLANNED = "planned, not applied"  # every action of a pass that only plans


@dataclass(frozen=True)
class ActionResult:
    action: Action
    ok: bool
    outcome: ActionOutcome
    error: str | None = None


class NotOursError(OperationError):
    """The row is not ours (any more): never written."""


async def _adopted_delete(api: LitellmApi, action: Action, claim: Claim) -> ActionOutcome:
    """Delete another owner's (llmao's) deployment, only while it is still not ours and, for a replacement,
    only once fleetllm's own deployment for the server is in LiteLLM (re-read now: make-before-break)."""
    current = await api.get(action.id)
    if current is None:
        return ActionOutcome.ALREADY_GONE
    if current.managed:
        raise NotOursError(f"{action.id} now carries fleetllm's marker: not deleted as an adopted deployment")
    if action.requires is not None:
        ours = await api.get(action.requires)
        if ours is None or not writable(ours, claim):
            raise NotOursError(f"fleetllm's deployment {action.requires} is not in LiteLLM: {action.id} kept "
                               "(make-before-break); the next pass retries")
    return ActionOutcome.DELETED if await api.delete(action.id) else ActionOutcome.ALREADY_GONE


async def _execute(api: LitellmApi, action: Action, claim: Claim) -> ActionOutcome:
    if action.adopted and action.kind is ActionKind.DELETE:
        return await _adopted_delete(api, action, claim)
    current = await api.get(action.id)
    if current is not None and not writable(current, claim):
        raise NotOursError(f"{action.id} is not this fleet's ({owner(current, claim)}): not written")
    if action.kind is ActionKind.DELETE:
        if current is None:
            return ActionOutcome.ALREADY_GONE
        return ActionOutcome.DELETED if await api.delete(action.id) else ActionOutcome.ALREADY_GONE
    spec = action.after
    assert spec is not None
    if current is None:
        await api.create(spec)
        return ActionOutcome.CREATED
    if current.spec == spec.spec and current.model_name == spec.model_name:
        return ActionOutcome.ALREADY_PRESENT
    if action.kind is ActionKind.REPLACE:
        await api.delete(action.id)
        await api.create(spec)
        return ActionOutcome.REPLACED
    await api.update(spec)
    return ActionOutcome.UPDATED


async def _run(api: LitellmApi, gate: asyncio.Semaphore, action: Action, claim: Claim) -> ActionResult:
    async with gate:
        try:
            return ActionResult(action, True, await _execute(api, action, claim))
        except NotOursError as exc:
            return ActionResult(action, False, ActionOutcome.REFUSED, str(exc))
        except (LitellmError, HttpError) as exc:
            return ActionResult(action, False, ActionOutcome.FAILED, str(exc))


async def apply_plan(plan: Plan, api: LitellmApi, concurrency: int = 8) -> tuple[ActionResult, ...]:
    gate = asyncio.Semaphore(max(1, concurrency))
    writes = [a for a in plan.actions if a.kind is not ActionKind.DELETE]
    deletes = [a for a in plan.actions if a.kind is ActionKind.DELETE]
    results = list(await asyncio.gather(*(_run(api, gate, a, plan.claim) for a in writes)))
    results += await asyncio.gather(*(_run(api, gate, a, plan.claim) for a in deletes))
    return tuple(results)


def next_pending(previous: Mapping[str, PendingDelete], plan: Plan, results: tuple[ActionResult, ...],
                 now: float) -> dict[str, PendingDelete]:
    """Failed deletes stay pending (attempts counted) until a pass deletes them or finds them gone;
    deletes held back by a valve stay pending too, so they are never forgotten."""
    pending: dict[str, PendingDelete] = {}
    for result in results:
        if result.action.kind is ActionKind.DELETE and not result.ok:
            old = previous.get(result.action.id)
            pending[result.action.id] = PendingDelete(
                result.action.id, (old.attempts if old else 0) + 1, result.error or result.outcome,
                old.first_failed_at if old else now)
    for held in plan.held:
        if held.kind is ActionKind.DELETE and held.id in previous and held.id not in pending:
            pending[held.id] = previous[held.id]
    return pending
