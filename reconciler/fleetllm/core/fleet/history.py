"""The newest valid commit on a branch: walk the head's first-parent line back past invalid commits.

Pure over two functions (validate a commit; read a commit's first parent), so the control plane's
revision tracker (fleetllm.server.revisions) and the reconcile job (`fleetllm reconcile`) keep the same
last valid revision by the very same walk, whatever git access each one has.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

MAX_WALK = 50  # commits examined behind an invalid head

V = TypeVar("V")


@dataclass(frozen=True)
class Walk(Generic[V]):
    """The newest valid commit's outcome (None: none within the walk) and the invalid commits passed."""

    valid: V | None
    skipped: tuple[str, ...]  # revisions found invalid, head first


def newest_valid(head: str, evaluate: Callable[[str], V | None], first_parent: Callable[[str], str | None], *,
                 known: Mapping[str, V] | None = None, max_walk: int = MAX_WALK) -> Walk[V]:
    """From `head` down its first parents: the first commit `evaluate` finds valid (its outcome), or one in
    `known` (a revision already known valid, e.g. the one being served: not evaluated again), examining
    the head and at most `max_walk` commits behind it."""
    skipped: list[str] = []
    revision: str | None = head
    for _ in range(max_walk + 1):
        if revision is None:
            break
        if known is not None and revision in known:
            return Walk(known[revision], tuple(skipped))
        outcome = evaluate(revision)
        if outcome is not None:
            return Walk(outcome, tuple(skipped))
        skipped.append(revision)
        revision = first_parent(revision)
    return Walk(None, tuple(skipped))
