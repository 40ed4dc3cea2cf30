"""Validation and rendering time of a synthetic fleet: 1,000 boxes / 3,000 servers by default.

    .venv/bin/python bench/validate_bench.py [--boxes 1000] [--repeat 7]

Reports the best and median wall time of: reading + strict YAML + schema + semantic rules
(`validate_snapshot(read_directory(...))`), and rendering every box's JSON.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.fleetgen import write_fleet
from fleetllm.adapters.git import read_directory
from fleetllm.core.fleet.bearer import Salt
from fleetllm.core.fleet.render import Bearers, render_all
from fleetllm.core.fleet.validate import validate_snapshot


def timed(fn, repeat: int) -> list[float]:  # type: ignore[no-untyped-def]
    runs = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - start)
    return runs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--boxes", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = write_fleet(Path(tmp) / "fleet", args.boxes)
        validation = validate_snapshot(read_directory(root))
        assert validation.fleet is not None, validation.diagnostics[:3]
        fleet = validation.fleet
        bearers = Bearers(Salt("bench-salt-0123456789abcdef"))
        validate_runs = timed(lambda: validate_snapshot(read_directory(root)), args.repeat)
        render_runs = timed(lambda: render_all(fleet, bearers), args.repeat)
    print(f"fleet: {len(fleet.boxes)} boxes, {fleet.server_count} servers")
    for label, runs in (("validate", validate_runs), ("render all boxes", render_runs)):
        print(f"{label:18s} best {min(runs) * 1000:7.1f} ms   median {statistics.median(runs) * 1000:7.1f} ms"
              f"   ({args.repeat} runs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
