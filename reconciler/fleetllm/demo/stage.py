"""What the demo's steps (following commits, the move-model scenario) may do with the running demo:
the Protocol run.Demo meets, so those steps depend on it without importing run.py back."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from fleetllm.adapters.state.sqlstore import SqlStateStore
from fleetllm.demo.boxes import SimulatedBox
from fleetllm.demo.controlplane import ControlPlane
from fleetllm.demo.workspace import Workspace
from fleetllm.job.engine import PassOutcome
from fleetllm.job.runner import PassRunner


class Stage(Protocol):
    workspace: Workspace | None
    control_plane: ControlPlane | None
    runner: PassRunner | None  # the shipped reconcile pass: `fleet` is the newest valid commit it read
    store: SqlStateStore | None  # the control plane's state store (rollouts, releases, box reports)
    boxes: dict[str, SimulatedBox]
    owned: set[str]

    @property
    def applying(self) -> bool: ...

    def say(self, message: str, style: str = "") -> None: ...

    def provision(self, box: SimulatedBox, what: str) -> None: ...

    def tick(self, note: str = "") -> PassOutcome | None: ...

    def wait(self, what: str, missing: Callable[[PassOutcome], list[str]]) -> PassOutcome | None: ...
