"""What adopting another owner's LiteLLM deployments decides, as data (adopt.py decides it; the plan
carries it)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from fleetllm.core.judge.intended import ServerKey


class AdoptSource(StrEnum):
    LLMAO = "llmao"


class Fate(StrEnum):
    REPLACED = "replaced"  # fleetllm's own deployment first, then this one is deleted
    WAITING = "waiting"  # the server does not serve (yet): kept until fleetllm has its own deployment
    HELD = "held"  # a safety valve or a pause holds the delete
    NOT_INTENDED = "not-intended"  # no server in the repository: left (--prune-adopted deletes it)
    PRUNED = "pruned"  # not intended, deleted because of --prune-adopted
    COMMERCIAL = "commercial"  # not self-hosted: never touched


@dataclass(frozen=True)
class Adoption:
    id: str
    model_name: str
    address: str | None  # the normalised address it routes to
    server: ServerKey | None
    fate: Fate
    reason: str
    replacement: str | None = None  # fleetllm's deployment id that must exist before this one goes
