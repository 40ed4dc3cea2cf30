"""The reconciler's state: what it must remember between passes, and what the control plane records.

- per server: the probe history (hysteresis, first seen, last healthy);
- pending deletes (a failed delete is retried next pass, never forgotten);
- capacity: failed rentals and terminations backing off, and rentals not heard of yet;
- pass records (reconciler/fleetllm/adapters/state/passes.py);
- the fleet id the passes owned LiteLLM's deployments by (fleetllm.core.judge.ownership.fleet_identity);
- per box, written by the control plane: the last config fetch and the last report-back.

`MemoryStore` for tests. Otherwise the control plane's state store is the reconciler's too: one
object (reconciler/fleetllm/adapters/state/sqlstore.py, on SQLite or PostgreSQL) implements this Protocol and the
control plane's, its tables created by the same migrations (reconciler/fleetllm/adapters/state/migrations.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from fleetllm.adapters.state.control import ControlReader
from fleetllm.adapters.state.locks import default_lock_path, file_lock
from fleetllm.adapters.state.passes import PassRecord
from fleetllm.core.boxreport import BoxReport
from fleetllm.core.capacity import Attempts, RentalWait
from fleetllm.core.control import NOTHING, ControlState, SyncRequest
from fleetllm.core.judge.intended import ServerKey
from fleetllm.core.judge.observed import BoxFacts
from fleetllm.core.judge.plan import PendingDelete
from fleetllm.core.judge.verdict import ServerHistory


class CapacityRecords(Protocol):
    """Capacity in the reconcile loop (fleetllm.job.capacity): the back-off of failed rentals and terminations and
    the rentals not heard of yet, kept across restarts; the status pages read them for the attention list."""

    def capacity_attempts(self) -> Attempts: ...

    def rental_waits(self) -> dict[str, RentalWait]: ...

    def save_capacity(self, attempts: Attempts, waits: Mapping[str, RentalWait]) -> None:
        """Replace both, in one transaction."""
        ...


class ReconcileState(ControlReader, CapacityRecords, Protocol):
    """What a reconcile pass reads and writes (fleetllm.adapters.state.store.StateStore is the control
    plane's side; SqlStateStore implements both)."""

    def box_facts(self) -> dict[str, BoxFacts]: ...

    def histories(self) -> dict[ServerKey, ServerHistory]: ...

    def save_histories(self, histories: Mapping[ServerKey, ServerHistory]) -> None: ...

    def pending_deletes(self) -> dict[str, PendingDelete]: ...

    def save_pending_deletes(self, pending: Mapping[str, PendingDelete]) -> None: ...

    def record_pass(self, record: PassRecord) -> None: ...

    def recent_passes(self, limit: int = 20) -> list[PassRecord]: ...

    def recorded_fleet_id(self) -> str | None:
        """The fleet id the last recording pass owned LiteLLM's deployments by (None: none recorded)."""
        ...

    def record_fleet_id(self, fleet_id: str, revision: str, at: float) -> None:
        """Keep the fleet id a pass owned by (written only when it changes)."""
        ...

    def pass_lock(self, lock_file: str | Path | None = None) -> AbstractContextManager[None]:
        """Single flight for passes (LockHeld when another holds it): a file lock, or PostgreSQL's
        advisory lock when the state is there."""
        ...


@dataclass
class MemoryStore:
    fetches: dict[str, float] = field(default_factory=dict)
    reports: dict[str, BoxReport] = field(default_factory=dict)
    history: dict[ServerKey, ServerHistory] = field(default_factory=dict)
    pending: dict[str, PendingDelete] = field(default_factory=dict)
    passes: list[PassRecord] = field(default_factory=list)
    fleet_id: str | None = None  # recorded_fleet_id
    controls: ControlState = NOTHING  # the operator controls (fleetllm.core.control); tests set them
    attempts: Attempts = field(default_factory=Attempts)
    waits: dict[str, RentalWait] = field(default_factory=dict)

    def box_facts(self) -> dict[str, BoxFacts]:
        return {box: BoxFacts(self.fetches.get(box), self.reports.get(box))
                for box in set(self.fetches) | set(self.reports)}

    def record_fetch(self, box: str, at: float) -> None:
        self.fetches[box] = at

    def record_report(self, box: str, report: BoxReport) -> None:
        self.reports[box] = report

    def histories(self) -> dict[ServerKey, ServerHistory]:
        return dict(self.history)

    def save_histories(self, histories: Mapping[ServerKey, ServerHistory]) -> None:
        self.history = dict(histories)

    def pending_deletes(self) -> dict[str, PendingDelete]:
        return dict(self.pending)

    def save_pending_deletes(self, pending: Mapping[str, PendingDelete]) -> None:
        self.pending = dict(pending)

    def capacity_attempts(self) -> Attempts:
        return self.attempts

    def rental_waits(self) -> dict[str, RentalWait]:
        return dict(self.waits)

    def save_capacity(self, attempts: Attempts, waits: Mapping[str, RentalWait]) -> None:
        self.attempts, self.waits = attempts, dict(waits)

    def record_pass(self, record: PassRecord) -> None:
        self.passes.append(record)

    def recent_passes(self, limit: int = 20) -> list[PassRecord]:
        return list(reversed(self.passes[-limit:]))

    def recorded_fleet_id(self) -> str | None:
        return self.fleet_id

    def record_fleet_id(self, fleet_id: str, revision: str, at: float) -> None:
        self.fleet_id = fleet_id

    def pass_lock(self, lock_file: str | Path | None = None) -> AbstractContextManager[None]:
        return file_lock(lock_file or default_lock_path(None))

    def control(self) -> ControlState:
        return self.controls

    def take_sync_request(self) -> SyncRequest | None:
        taken = self.controls.sync
        self.controls = dataclasses.replace(self.controls, sync=None)
        return taken
