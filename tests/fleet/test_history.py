"""fleetllm.core.fleet.history.newest_valid: the walk back past invalid commits that the control plane's
revision tracker and `fleetllm reconcile` share."""

from __future__ import annotations

from fleetllm.core.fleet.history import newest_valid

# c5 -> c4 -> ... -> c0 (first parents); the valid ones map to their outcome
PARENT = {f"c{i}": f"c{i - 1}" if i else None for i in range(6)}


def test_the_head_itself_when_valid() -> None:
    walk = newest_valid("c5", {"c5": "F5"}.get, PARENT.get)
    assert (walk.valid, walk.skipped) == ("F5", ())


def test_walks_back_past_invalid_commits_head_first() -> None:
    walk = newest_valid("c5", {"c2": "F2", "c0": "F0"}.get, PARENT.get)
    assert (walk.valid, walk.skipped) == ("F2", ("c5", "c4", "c3"))


def test_a_known_revision_is_not_evaluated_again() -> None:
    seen: list[str] = []

    def evaluate(revision: str) -> str | None:
        seen.append(revision)
        return None

    walk = newest_valid("c5", evaluate, PARENT.get, known={"c3": "served"})
    assert (walk.valid, seen) == ("served", ["c5", "c4"])


def test_gives_up_after_max_walk_or_the_root() -> None:
    assert newest_valid("c5", {"c0": "F0"}.get, PARENT.get, max_walk=2).valid is None
    walk = newest_valid("c5", {}.get, PARENT.get)
    assert walk.valid is None and walk.skipped == ("c5", "c4", "c3", "c2", "c1", "c0")
