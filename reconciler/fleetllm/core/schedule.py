"""When reconcile passes run, and when one is late: the one rule the reconcile job's loop keeps
(`next_delay`) and the control plane watches (`overdue_after`: its notification, its attention strip).

Passes run every `reconcile.interval_s` plus up to JITTER of it, so many reconcilers never beat in step;
a pass is overdue after two intervals and a minute, which no jitter reaches.
"""

from __future__ import annotations

import random

JITTER = 0.1  # of the interval, at most, added to each wait between passes


def next_delay(interval_s: float, rng: random.Random | None = None) -> float:
    """The interval plus up to JITTER of it, so many reconcilers never beat in step."""
    return interval_s + (rng or random.Random()).uniform(0, interval_s * JITTER)  # noqa: S311 (jitter)


def overdue_after(interval_s: float) -> float:
    """A pass is overdue after two intervals and a minute (passes run every interval plus up to JITTER)."""
    return 2.0 * interval_s + 60.0
