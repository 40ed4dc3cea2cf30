"""Saved plans: `fleetllm plan --out FILE`, then `fleetllm apply FILE` applies exactly that plan.

The file is the JSON plan (no secret in it). Applying re-observes and re-plans; the new plan must be
the same revision with the same actions (kind, deployment id, spec digest), or nothing is written and
the apply says the plan is stale, as Terraform refuses a saved plan when state moved.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleetllm.core.judge.plan import Plan
from fleetllm.core.judge.plantext import FORMAT_VERSION
from fleetllm.errors import OperationError

Signature = tuple[tuple[str, str, str | None], ...]


class StalePlan(OperationError):  # noqa: N818 (reads as what happened)
    """The saved plan no longer matches what a new plan would do."""


class PlanFileError(OperationError):
    """The saved plan file cannot be read or is not one."""


def signature(plan: Plan) -> Signature:
    return tuple((str(a.kind), a.id, a.after.spec if a.after is not None else None) for a in plan.actions)


def _document_signature(doc: dict[str, Any]) -> Signature:
    out = []
    for action in doc["actions"]:
        after = action.get("after")
        spec = after["model_info"].get("fleetllm_spec") if isinstance(after, dict) else None
        out.append((str(action["action"]), str(action["id"]), spec))
    return tuple(out)


@dataclass(frozen=True)
class SavedPlan:
    path: str
    revision: str
    actions: Signature
    adopt_source: str | None = None  # made with `plan --adopt SOURCE`: apply adopts the same way

    @classmethod
    def load(cls, path: str | Path) -> SavedPlan:
        try:
            doc = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise PlanFileError(f"{path}: not a readable plan file ({exc})") from None
        major = FORMAT_VERSION.split(".")[0]
        if not isinstance(doc, dict) or str(doc.get("format_version", "")).split(".")[0] != major:
            raise PlanFileError(f"{path}: not a plan of format {FORMAT_VERSION} (made by `fleetllm plan --out`)")
        try:
            adoption = doc.get("adoption")
            source = adoption.get("source") if isinstance(adoption, dict) else None
            return cls(str(path), str(doc["revision"]), _document_signature(doc),
                       source if isinstance(source, str) else None)
        except (KeyError, TypeError, AttributeError) as exc:
            raise PlanFileError(f"{path}: malformed plan file ({exc})") from None

    def check(self, plan: Plan) -> None:
        if plan.revision != self.revision:
            raise StalePlan(f"the saved plan {self.path} is for revision {self.revision[:12]}, the fleet is now at "
                            f"{plan.revision[:12]}: nothing applied; run fleetllm plan again")
        now = signature(plan)
        if now != self.actions:
            gone = len(set(self.actions) - set(now))
            new = len(set(now) - set(self.actions))
            raise StalePlan(f"the fleet changed since {self.path} was made ({gone} planned action(s) no longer "
                            f"apply, {new} new): nothing applied; run fleetllm plan again")
