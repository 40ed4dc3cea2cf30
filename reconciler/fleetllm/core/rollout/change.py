"""What a change of a box's config does to its servers.

`box_change` is the one place that says which servers a change starts, restarts and stops (as a
`fleetllm_contract.division.BoxChange`, the one type for it): the stable card division's own prediction
(`fleetllm_contract.division.box_change`, what the box's installer will do), so a neighbour whose share
the card cannot keep counts as restarted (drained first, within the budget). Configs without their
rendered documents (a test's) fall back to the boot digests.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable

from fleetllm.core.rollout.model import BoxConfig, ServerSpec
from fleetllm_contract import division
from fleetllm_contract.division import BoxChange


def box_change(old: BoxConfig | None, new: BoxConfig | None, card_gb: float | None = None) -> BoxChange:
    """Started, restarted, stopped and unchanged server names between two configs of one box."""
    before = old.by_name() if old is not None else {}
    after = new.by_name() if new is not None else {}
    both = before.keys() & after.keys()
    restarted = frozenset(n for n in both if before[n].digest != after[n].digest)
    predicted = None
    if old is not None and new is not None and old.document and new.document:
        predicted = division.box_change(old.document, new.document, card_gb)
        restarted |= predicted.restarted & both
    if old is not None and new is not None and old.boot != new.boot:
        restarted = frozenset(both)  # the gateway changed: its servers move between loopback and the host
    return BoxChange(started=frozenset(after.keys() - before.keys()), restarted=restarted,
                     stopped=frozenset(before.keys() - after.keys()), unchanged=frozenset(both) - restarted,
                     redivided=predicted.redivided if predicted is not None else False,
                     card_known=predicted.card_known if predicted is not None else True)


def servers_named(config: BoxConfig | None, names: frozenset[str]) -> tuple[ServerSpec, ...]:
    if config is None:
        return ()
    return tuple(s for s in config.servers if s.name in names)


def disrupted_servers(old: BoxConfig | None, new: BoxConfig | None, card_gb: float | None = None
                      ) -> tuple[ServerSpec, ...]:
    """The servers of `old` that moving the box to `new` takes out (restarted or removed)."""
    return servers_named(old, box_change(old, new, card_gb).disrupted)


def over_budget(servers: Iterable[ServerSpec], budget: Callable[[str], int]) -> dict[str, int]:
    """Per model (sorted) of which `servers` holds more than its budget, how many it holds."""
    counts = Counter(s.model for s in servers)
    return {model: n for model, n in sorted(counts.items()) if n > budget(model)}
