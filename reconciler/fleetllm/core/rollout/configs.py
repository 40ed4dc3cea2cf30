"""A box's config at one revision as the rollout sees it, from the fleet model and its rendered JSON."""

from __future__ import annotations

import hashlib
from collections.abc import Callable

from fleetllm.core.fleet.jsonvalue import canonical_json, freeze_mapping
from fleetllm.core.fleet.model import Fleet
from fleetllm.core.fleet.render import Bearers, render_box
from fleetllm.core.rollout.model import BoxConfig, ServerSpec

DeploymentId = Callable[[str, int], str]


def box_config(fleet: Fleet, box_name: str, bearers: Bearers, deployment_id: DeploymentId) -> BoxConfig | None:
    """None when the box is not in the placement at this revision. RenderError as render_box."""
    box = fleet.box(box_name)
    if box is None:
        return None
    document = render_box(fleet, box_name, bearers)
    entries = document["servers"]
    assert isinstance(entries, list)
    digests = {e["name"]: e["digest"] for e in entries if isinstance(e, dict)}
    grace = fleet.settings.reconcile.health_grace_s
    servers = []
    for row in box.servers:
        recipe = fleet.recipes[row.model]
        servers.append(ServerSpec(name=row.name, model=row.model, port=row.port, digest=str(digests[row.name]),
                                  deployment=deployment_id(box_name, row.port),
                                  grace_s=recipe.health_grace_s if recipe.health_grace_s is not None else grace))
    gateway = document.get("gateway")  # holds the gateway's bearer: only its digest is kept in `boot`
    boot = "sha256:" + hashlib.sha256(canonical_json(gateway).encode()).hexdigest() if gateway is not None else ""
    return BoxConfig(fleet.revision, tuple(servers), boot, freeze_mapping(document))
