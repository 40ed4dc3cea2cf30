"""Server-level changes (boot lifetime): which vLLM processes are added, removed, moved or reconfigured.

A server's configuration is its entry in the box JSON, rendered by `fleetllm.core.fleet.render` with the
bearer replaced by a description of where the bearer derives from. The bearer is a function of the
box, the listen port and whether the pair is a legacy one, so comparing the descriptions tells
exactly when it changes, without the salt.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass

from fleetllm.core.diff.fields import diff_fields
from fleetllm.core.diff.report import BearerChange, Lifetime, ServerAction, ServerChange, ServerRef
from fleetllm.core.fleet.jsonvalue import JSON
from fleetllm.core.fleet.model import Fleet
from fleetllm.core.fleet.render import server_entry
from fleetllm_contract.addresses import normalise_host

# Entry keys that are not compared as fields: where the server is (a move says so), its bearer
# (compared by source) and the digest (a function of the rest).
NOT_FIELDS = ("host", "port", "api_key", "digest")


def bearer_source(fleet: Fleet, box: str, port: int) -> str:
    if fleet.settings.is_legacy(box, port):
        return "the legacy shared key"
    return f"derived from {normalise_host(box)}:{port}"


@dataclass(frozen=True)
class Placed:
    ref: ServerRef
    config: dict[str, JSON]  # the box JSON entry's boot fields (name included)
    bearer: str  # where the bearer comes from


def placed_servers(fleet: Fleet) -> list[Placed]:
    placed = []
    for box in fleet.boxes.values():
        for row in box.servers:
            source = bearer_source(fleet, box.name, row.port)
            entry = server_entry(fleet, box, row, source)
            config = {k: v for k, v in entry.items() if k not in NOT_FIELDS}
            placed.append(Placed(ServerRef(box.name, row.port, row.name, row.model), config, source))
    return sorted(placed, key=lambda p: p.ref)


Key = Callable[[ServerRef], Hashable]

# How a server at BASE is recognised at HEAD, most specific first: same box and process name (its
# port may change); same box, port and model (a rename); the same model and name on another box;
# the same model anywhere. Ties are paired in (box, port) order, so the result is deterministic.
MATCH_KEYS: tuple[Key, ...] = (
    lambda r: (r.box, r.name),
    lambda r: (r.box, r.port, r.model),
    lambda r: (r.model, r.name),
    lambda r: r.model,
)


def match(base: list[Placed], head: list[Placed]) -> list[tuple[Placed | None, Placed | None]]:
    pairs: list[tuple[Placed | None, Placed | None]] = []
    left, right = list(base), list(head)
    for key in MATCH_KEYS:
        waiting: dict[Hashable, list[Placed]] = {}
        for p in right:
            waiting.setdefault(key(p.ref), []).append(p)
        unmatched = []
        for b in left:
            candidates = waiting.get(key(b.ref))
            if candidates:
                pairs.append((b, candidates.pop(0)))
            else:
                unmatched.append(b)
        left = unmatched
        right = [p for group in waiting.values() for p in group]
        right.sort(key=lambda p: p.ref)
    pairs.extend((b, None) for b in left)
    pairs.extend((None, h) for h in right)
    return pairs


def server_changes(base: Fleet, head: Fleet) -> tuple[ServerChange, ...]:
    changes = [c for b, h in match(placed_servers(base), placed_servers(head)) if (c := _change(b, h))]
    return tuple(sorted(changes, key=lambda c: (c.ref, c.action)))


def _change(before: Placed | None, after: Placed | None) -> ServerChange | None:
    if after is None:
        assert before is not None
        return ServerChange(ServerAction.REMOVE, before.ref, None)
    if before is None:
        return ServerChange(ServerAction.ADD, None, after.ref)
    fields = diff_fields(before.config, after.config, Lifetime.BOOT)
    bearer = None if before.bearer == after.bearer else BearerChange(after.ref, before.bearer, after.bearer)
    if (before.ref.box, before.ref.port) != (after.ref.box, after.ref.port):
        return ServerChange(ServerAction.MOVE, before.ref, after.ref, fields, bearer)
    if fields or bearer:
        return ServerChange(ServerAction.CHANGE, before.ref, after.ref, fields, bearer)
    return None


@dataclass
class ProcessPlan:
    """What one box does with its processes when it re-fetches its config."""

    start: set[str]
    restart: set[str]
    stop: set[str]


def process_plans(changes: Iterable[ServerChange]) -> dict[str, ProcessPlan]:
    plans: dict[str, ProcessPlan] = {}

    def plan(box: str) -> ProcessPlan:
        return plans.setdefault(box, ProcessPlan(set(), set(), set()))

    for change in changes:
        before, after = change.before, change.after
        if before and after and (before.box, before.name) == (after.box, after.name):
            plan(after.box).restart.add(after.name)
            continue
        if before:
            plan(before.box).stop.add(before.name)
        if after:
            plan(after.box).start.add(after.name)
    return plans


def box_documents(fleet: Fleet) -> dict[str, dict[str, JSON]]:
    """Each box's JSON as far as the division reads it: its server entries, the bearer as its source."""
    documents: dict[str, dict[str, JSON]] = {}
    for box in fleet.boxes.values():
        entries: list[JSON] = []
        for row in box.servers:
            source = bearer_source(fleet, box.name, row.port)
            entry = server_entry(fleet, box, row, source)
            entries.append({k: v for k, v in entry.items() if k != "digest"})
        documents[box.name] = {"servers": entries}
    return documents
