"""Whose a LiteLLM deployment is: the one pure function every planner and writer reads ownership by.

Several fleets may share one LiteLLM (issue 27). Every deployment a fleet writes carries the
`managed_by: fleetllm` marker and the fleet's id (`model_info.fleetllm_fleet`, fleet.yaml `fleet_id`); a
fleet plans, writes and deletes only deployments with its own id. Deployments written before fleet ids
(the marker, no id) are the fleet's when their recorded box is one of its boxes (a box serves one
fleet): it adopts them into its id in place, by an update (no delete, no restart). Those of boxes it
does not hold may be another fleet's and are never touched.

A fleet without `fleet_id` is judged new or existing by LiteLLM, the one record every control plane and
CLI of the fleet reads alike: existing when LiteLLM holds a deployment written before fleet ids for one
of its boxes, or one already adopted into its derived id. A new fleet must name itself; an existing one
gets an id derived from its repository's first commit (the same on every pass, every clone and every
control plane), printed with each pass until fleet.yaml holds it. It is existing by its own history too:
each pass that records keeps the id it owned by in the state store, so a fleet whose LiteLLM was emptied
(a reset proxy, a new database) is still known by the derived id its earlier passes recorded, and its
passes go on (recreating its deployments). A fresh state store records nothing: a new fleet stays refused.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from fleetllm.core.judge.intended import INFO_FLEET, Intended
from fleetllm.core.judge.observed import Deployment
from fleetllm.errors import OperationError


class Owner(StrEnum):
    OURS = "ours"  # the marker and this fleet's id
    ADOPTABLE = "adoptable"  # the marker, no fleet id, one of this fleet's boxes: adopted in place
    UNCLAIMED = "unclaimed"  # the marker, no fleet id, a box this fleet does not hold: never touched
    OTHER_FLEET = "other-fleet"  # the marker and another fleet's id: never touched
    NOT_FLEETLLM = "not-fleetllm"  # no marker: never written (llmao's, a config-file model, a person's)


WRITABLE = frozenset({Owner.OURS, Owner.ADOPTABLE})  # what a fleet may update and delete


@dataclass(frozen=True)
class Claim:
    """What a fleet owns in LiteLLM: deployments with its id, and the id-less ones of its boxes.
    `fleet_id` None: the pure planner called without an identity (its unit tests): id-less deployments
    are its own, as before fleet ids; a pass always has an id (`fleet_identity`)."""

    fleet_id: str | None
    boxes: frozenset[str] = frozenset()


def claim_of(intended: Intended) -> Claim:
    return Claim(intended.fleet_id, intended.fleet_boxes | {s.box for s in intended.servers.values()})


def recorded_fleet(deployment: Deployment) -> str | None:
    value = deployment.model_info.get(INFO_FLEET)
    return value if isinstance(value, str) else None


def owner(deployment: Deployment, claim: Claim) -> Owner:
    """The one reading of ownership (planner, adoption, apply's re-read, the rollout's drains)."""
    if not deployment.managed:
        return Owner.NOT_FLEETLLM
    if INFO_FLEET in deployment.model_info:
        return Owner.OURS if recorded_fleet(deployment) == claim.fleet_id else Owner.OTHER_FLEET
    if claim.fleet_id is None:
        return Owner.OURS
    key = deployment.recorded_key
    return Owner.ADOPTABLE if key is not None and key[0] in claim.boxes else Owner.UNCLAIMED


def writable(deployment: Deployment, claim: Claim) -> bool:
    return owner(deployment, claim) in WRITABLE


class FleetIdError(OperationError):
    """The fleet has no id and none can be derived: nothing is planned or applied."""


@dataclass(frozen=True)
class FleetIdentity:
    fleet_id: str | None  # None only when LiteLLM was not listed and no id can be had: nothing is written
    note: str | None = None  # said on every pass while the id is derived, not written in fleet.yaml
    settled: bool = True  # declared, or judged existing; False: derived unjudged (LiteLLM was not listed)


def derived_fleet_id(origin: str) -> str:
    """An existing fleet's id: from its repository's first (root) commit, stable across passes and clones."""
    return f"git-{origin[:12].lower()}"


def fleet_identity(declared: str | None, origin: str | None, deployments: Iterable[Deployment] | None,
                   boxes: frozenset[str], recorded: str | None = None) -> FleetIdentity:
    """The id a pass writes and owns by. `declared`: fleet.yaml fleet_id; `origin`: the repository's root
    commit (None: not read from git); `deployments`: LiteLLM's (None: the listing failed); `recorded`: the
    id the state store's earlier passes owned by (ReconcileState.recorded_fleet_id; None: none)."""
    if declared is not None:
        return FleetIdentity(declared)
    if deployments is None:  # nothing is planned without the listing: no need to judge
        return FleetIdentity(derived_fleet_id(origin) if origin else None, settled=False)
    derived = derived_fleet_id(origin) if origin else None
    if origin and derived is not None and any(recorded_fleet(d) == derived and d.managed for d in deployments):
        return FleetIdentity(derived, _derived_note(derived, origin))  # already adopted into it
    if origin and derived is not None and recorded == derived:  # its own passes owned by it: LiteLLM was emptied
        return FleetIdentity(derived, _derived_note(derived, origin))
    existing = sorted({d.id for d in deployments if owner(d, Claim("", boxes)) is Owner.ADOPTABLE})
    if not existing:
        earlier = "" if recorded is None else (
            f"; the state store records that this fleet's passes owned LiteLLM's deployments as `{recorded}`: if "
            f"fleet_id was taken out of fleet.yaml, put `fleet_id: {recorded}` back")
        raise FleetIdError(
            "fleet.yaml: fleet_id is required for a new fleet (LiteLLM holds no deployment of this fleet's boxes "
            "written before fleet ids, and no earlier pass recorded this fleet's derived id in the state store): add "
            "`fleet_id: NAME` (lower-case letters, digits and '-'), unique among the fleets that share this LiteLLM"
            + earlier)
    if not origin:
        raise FleetIdError(
            f"fleet.yaml: fleet_id is required: LiteLLM holds {len(existing)} deployment(s) of this fleet written "
            "before fleet ids (e.g. " + existing[0] + "), and the fleet is not read from a git repository, so no "
            "id can be derived; add `fleet_id: NAME` (they are adopted into it in place)")
    return FleetIdentity(derived_fleet_id(origin), _derived_note(derived_fleet_id(origin), origin))


def _derived_note(derived: str, origin: str) -> str:
    return (f"fleet.yaml has no fleet_id: this fleet owns its LiteLLM deployments as `{derived}` (derived from "
            f"its repository's first commit {origin[:12]}); add `fleet_id: {derived}` to fleet.yaml to keep it (a "
            "second fleet forked from the same repository derives the same id: give each its own)")
