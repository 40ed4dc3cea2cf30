"""What the demo's steps (following commits, the move-model scenario) may do with the running demo:
the Protocol run.Demo meets, so those steps depend on it without importing run.py back."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from fleetllm.demo.boxes import SimulatedBox
from fleetllm.demo.controlplane import ControlPlane
from fleetllm.demo.passes import Passes
from fleetllm.demo.workspace import Workspace
from fleetllm.job.engine import PassOutcome


class Stage(Protocol):
    workspace: Workspace | None
    control_plane: ControlPlane | None
    passes: Passes | None
    boxes: dict[str, SimulatedBox]
    owned: set[str]

    @property
    def applying(self) -> bool: ...

    def say(self, message: str, style: str = "") -> None: ...

    def provision(self, box: SimulatedBox, what: str) -> None: ...

    def tick(self, note: str = "") -> PassOutcome | None: ...

    def wait(self, what: str, missing: Callable[[PassOutcome], list[str]]) -> PassOutcome | None: ...
