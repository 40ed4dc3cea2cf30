"""How the fleet-sized work grows from 100 to 10,000 boxes (3 servers each): validation, rendering,
and one reconcile pass against local fakes with its state in PostgreSQL. Writes a JSON file of the
figures and a plot (matplotlib, the `bench` extra).

    .venv/bin/pip install -e '.[bench]'
    .venv/bin/python bench/scale_bench.py [--boxes 100,300,1000,3000,10000] [--out docs/scale-growth.png]

- validate: `validate_snapshot(read_directory(...))` of bench/fleetgen's repository (strict YAML, JSON
  Schema, typed model, semantic rules), best of `--repeat`;
- render: `render_all` (every box's JSON, 3 bearers derived per box), best of `--repeat`, per box;
- reconcile: bench/reconcile_pass.py's two passes (the first creates every healthy server's deployment,
  the second is the steady state), Vast and LiteLLM fakes over HTTP, 5% of servers hanging, the
  reconciler's state in a fresh PostgreSQL schema (FLEETLLM_TEST_PG_URL or a throwaway cluster).

Each figure carries the 1-minute load average read just before it was measured (the 2 cores are
shared with other sessions).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import reconcile_pass
from bench.fleetgen import write_fleet
from fleetllm.adapters.git import read_directory
from fleetllm.core.fleet.bearer import Salt
from fleetllm.core.fleet.render import Bearers, render_all
from fleetllm.core.fleet.validate import validate_snapshot
from tests.state.postgres import database_url, schema_url


def best_of(fn: Callable[[], object], repeat: int) -> float:
    runs = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - start)
    return min(runs)


def load1() -> float:
    return round(os.getloadavg()[0], 2)


def measure(boxes: int, repeat: int, pg_database: str, probe_concurrency: int) -> dict[str, Any]:
    row: dict[str, Any] = {"boxes": boxes, "servers": 3 * boxes}
    with tempfile.TemporaryDirectory(prefix="fleetllm-scale-") as tmp:
        root = write_fleet(Path(tmp) / "fleet", boxes)
        validation = validate_snapshot(read_directory(root))
        assert validation.fleet is not None, validation.diagnostics[:3]
        fleet = validation.fleet
        row["validate_load"] = load1()
        row["validate_s"] = best_of(lambda: validate_snapshot(read_directory(root)), repeat)
        bearers = Bearers(Salt("bench-salt-0123456789abcdef"))
        row["render_load"] = load1()
        row["render_all_s"] = best_of(lambda: render_all(fleet, bearers), repeat)
        row["render_per_box_ms"] = row["render_all_s"] / boxes * 1000
    with schema_url(pg_database) as state:
        args = argparse.Namespace(boxes=boxes, probe_concurrency=probe_concurrency, probe_timeout=3.0,
                                  write_concurrency=8, state=state)
        row["reconcile_load"] = load1()
        outcome = asyncio.run(reconcile_pass.run(args))
    first, steady = outcome["passes"]["first pass (creates)"], outcome["passes"]["steady pass"]
    row["first_pass_s"], row["first_pass_actions"] = first["wall_s"], first["actions"]
    row["steady_pass_s"], row["steady_pass_cpu_s"] = steady["wall_s"], steady["reconciler_cpu_s"]
    row["steady_verdicts"] = steady["verdicts"]
    return row


def plot(rows: list[dict[str, Any]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    boxes = [r["boxes"] for r in rows]
    fig, (total, per_box) = plt.subplots(1, 2, figsize=(11, 4.4), constrained_layout=True)
    series = [("validate", "validate_s", "o-"), ("render all boxes", "render_all_s", "s-"),
              ("reconcile: first pass (creates)", "first_pass_s", "^-"),
              ("reconcile: steady pass", "steady_pass_s", "v-")]
    for label, key, style in series:
        total.plot(boxes, [r[key] for r in rows], style, label=label)
        per_box.plot(boxes, [r[key] / r["boxes"] * 1000 for r in rows], style, label=label)
    total.set(xscale="log", yscale="log", xlabel="boxes (3 servers each)", ylabel="seconds",
              title="Time for the whole fleet")
    per_box.set(xscale="log", yscale="log", xlabel="boxes (3 servers each)", ylabel="milliseconds per box",
                title="Time per box")
    for axes in (total, per_box):
        axes.grid(True, which="both", alpha=0.3)
        axes.set_xticks(boxes, [f"{b:,}" for b in boxes])
    total.legend(fontsize=8)
    loads = sorted({r[k] for r in rows for k in ("validate_load", "render_load", "reconcile_load")})
    fig.suptitle(f"fleetllm on 2 shared cores (1-min load average {loads[0]}–{loads[-1]} while measuring)",
                 fontsize=10)
    fig.savefig(out, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--boxes", default="100,300,1000,3000,10000")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--probe-concurrency", type=int, default=256)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "scale-growth.png")
    parser.add_argument("--json", type=Path, help="also write the figures there")
    args = parser.parse_args()
    rows = []
    with database_url() as pg_database:
        if pg_database is None:
            raise SystemExit("no PostgreSQL: apt-get install postgresql, or set FLEETLLM_TEST_PG_URL")
        for boxes in (int(b) for b in args.boxes.split(",")):
            rows.append(measure(boxes, args.repeat, pg_database, args.probe_concurrency))
            print(json.dumps(rows[-1]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    plot(rows, args.out)
    print(f"plot: {args.out}")


if __name__ == "__main__":
    main()
