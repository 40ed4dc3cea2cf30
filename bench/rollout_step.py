"""The staged rollout's step over a large simulated fleet: how long one pass's step takes, and how many
passes and waves a fleet-wide recipe change takes (every server restarts), with 3 servers a box and 3
replicas a model. Pure CPU: the step function and the pass-by-pass simulator of tests/rollout/sim.py.

    .venv/bin/python bench/rollout_step.py --boxes 100 300 1000
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fleetllm.core.rollout.model import RolloutState
from tests.rollout.sim import Sim


def layout(boxes: int) -> dict[str, list[tuple[str, int]]]:
    models = boxes  # 3 servers a box, 3 replicas a model: as many models as boxes
    rows: dict[str, list[tuple[str, int]]] = {f"box{b:05d}": [] for b in range(boxes)}
    stride = max(1, boxes // 3)
    for m in range(models):
        for r in range(3):
            rows[f"box{(m + stride * r) % boxes:05d}"].append((f"model{m:05d}", 8001 + r))
    return rows


def run(boxes: int, budget: int) -> dict[str, float]:
    rows = layout(boxes)
    models = {m for r in rows.values() for m, _ in r}
    sim = Sim.start("r1", rows, dict.fromkeys(models, "v1"), budgets=dict.fromkeys(models, budget))
    sim.run(2)
    sim.commit("r2", rows, dict.fromkeys(models, "v2"))
    times: list[float] = []
    passes = 0
    while passes < 10_000:
        started = time.perf_counter()
        sim.one_pass()
        times.append(time.perf_counter() - started)
        passes += 1
        if sim.rollout is not None and sim.rollout.state is not RolloutState.RUNNING:
            break
    assert sim.rollout is not None
    assert sim.rollout.state is RolloutState.CONVERGED
    assert sim.failed_requests == []
    return {"passes": passes, "waves": sim.rollout.waves, "median_s": statistics.median(times),
            "max_s": max(times), "max_out": max(n for p in sim.unreachable for n in p.values())}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--boxes", type=int, nargs="+", default=[100, 300, 1000])
    parser.add_argument("--budget", type=int, default=1)
    args = parser.parse_args()
    print("boxes  servers  passes  waves  step+sim median  max      most of a model out")
    for boxes in args.boxes:
        r = run(boxes, args.budget)
        print(f"{boxes:5d}  {3 * boxes:7d}  {r['passes']:6.0f}  {r['waves']:5.0f}  {r['median_s'] * 1000:11.1f} ms"
              f"  {r['max_s'] * 1000:7.1f} ms  {r['max_out']:.0f}")


if __name__ == "__main__":
    main()
