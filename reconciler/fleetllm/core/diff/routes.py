"""LiteLLM deployment changes (live lifetime): what the reconciler creates, updates or deletes.

A deployment's identity is (box, listen port). Its owned fields are the model name callers ask
for, the name vLLM serves, the recipe's `litellm` block, and the bearer (here: its source). The
api_base is left out: it comes from the provider's port mapping, which only a live observation has.
On a box with a gateway LiteLLM reaches every server through the gateway with the gateway's bearer.
"""

from __future__ import annotations

from fleetllm.core.diff.fields import diff_fields, same
from fleetllm.core.diff.report import DeploymentAction, DeploymentChange, Lifetime, Route
from fleetllm.core.diff.servers import bearer_source
from fleetllm.core.fleet.jsonvalue import thaw
from fleetllm.core.fleet.model import Fleet, ReconcileMode

Identity = tuple[str, int]


def routes(fleet: Fleet) -> dict[Identity, Route]:
    litellm = {name: (thaw(r.litellm.params), thaw(r.litellm.model_info)) for name, r in fleet.recipes.items()}
    found: dict[Identity, Route] = {}
    for box in fleet.boxes.values():
        for row in box.servers:
            params, model_info = litellm[row.model]
            found[(box.name, row.port)] = Route(
                model_name=row.model,
                served_model_name=fleet.recipes[row.model].vllm.served_model_name,
                params=params,
                model_info=model_info,
                bearer=(bearer_source(fleet, box.name, row.port) if box.gateway_port is None
                        else bearer_source(fleet, box.name, box.gateway_port) + " (the box gateway)"),
            )
    return found


def paused(fleet: Fleet, identity: Identity) -> bool:
    """The reconciler leaves this deployment alone: its box or its recipe says `reconcile: paused`."""
    box = fleet.boxes[identity[0]]
    row = next(r for r in box.servers if r.port == identity[1])
    return ReconcileMode.PAUSED in (box.reconcile, fleet.recipes[row.model].reconcile)


def deployment_changes(base: Fleet, head: Fleet) -> tuple[DeploymentChange, ...]:
    before, after = routes(base), routes(head)
    changes = []
    for identity in sorted(set(before) | set(after)):
        old, new = before.get(identity), after.get(identity)
        if old is None:
            assert new is not None
            changes.append(DeploymentChange(DeploymentAction.CREATE, *identity, None, new,
                                            paused=paused(head, identity)))
        elif new is None:
            changes.append(DeploymentChange(DeploymentAction.DELETE, *identity, old, None,
                                            paused=paused(base, identity)))
        elif not same(old.as_json(), new.as_json()):
            action = DeploymentAction.UPDATE if old.model_name == new.model_name else DeploymentAction.REPLACE
            fields = diff_fields(old.as_json(), new.as_json(), Lifetime.LIVE)
            changes.append(DeploymentChange(action, *identity, old, new, fields,
                                            paused=paused(base, identity) or paused(head, identity)))
    return tuple(changes)
