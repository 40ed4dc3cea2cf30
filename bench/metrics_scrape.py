"""The fetch log at its retention: what a batch of fetch records costs to write, and what one GET /metrics
and one page read of it. The box freshness series read, per box, the last GET /vllm/config answered 200 or
304 (`last_config_answered`), the latest reports and the attention list; the pages read each box's last
config served (`last_config_served`).

A SQLite store filled with ROWS fetch records over BOXES boxes (a third each 200, 304, 403), retention
ROWS; then BATCHES batches of 512 records (the writer's FLUSH_AT) written, each flushed, and the CPU of the
process a record printed (min / median / max over the batches: sqlite3 runs in the calling thread); then
one prune back to ROWS (CPU a record dropped); then each read timed REPEAT times, the median printed (and
the admin API's page of one box's records, GET /admin/fetches?box=). The collector reuses one read for
30 s (BoxFreshness).

    .venv/bin/python bench/metrics_scrape.py --rows 200000 --boxes 1000
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fleetllm.adapters.state import open_store
from fleetllm.adapters.state.records import BoxApi, FetchRecord
from fleetllm.adapters.state.sqlstore import FLUSH_AT
from fleetllm.adapters.state.store import FetchRetention


def record(i: int, boxes: int) -> FetchRecord:
    return FetchRecord(at=1e9 + i, endpoint=BoxApi.CONFIG, status=(200, 304, 403)[i % 3], peer="192.0.2.1",
                       box=f"box-{i % boxes}", revision="r", replica="a")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--boxes", type=int, default=1000)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(f"sqlite:///{tmp}/state.db", Path(tmp),
                           retention=FetchRetention(max_rows=args.rows, max_age_s=1e12, every_s=1e12))
        started = time.perf_counter()
        for i in range(args.rows):
            store.record_fetch(record(i, args.boxes))
        store.flush()
        print(f"{args.rows} fetch records over {args.boxes} boxes written in {time.perf_counter() - started:.1f} s")
        per_record = []
        for n in range(args.batches):
            cpu = time.process_time()
            for i in range(FLUSH_AT):
                store.record_fetch(record(args.rows + n * FLUSH_AT + i, args.boxes))
            store.flush()
            per_record.append((time.process_time() - cpu) / FLUSH_AT * 1e6)
        ordered = sorted(per_record)
        print(f"write, {args.batches} batches of {FLUSH_AT}: CPU a record {ordered[0]:.1f} / "
              f"{statistics.median(ordered):.1f} / {ordered[-1]:.1f} us (min / median / max)")
        cpu = time.process_time()
        dropped = store.prune()
        print(f"prune back to {args.rows}: {dropped} records dropped, CPU a record "
              f"{(time.process_time() - cpu) / max(dropped, 1) * 1e6:.1f} us")
        reads = {name: getattr(store, name) for name in ("last_config_answered", "last_config_served",
                                                           "latest_reports", "attention")}
        reads["recent_fetches(box=), 100"] = lambda: store.recent_fetches(box="box-7", limit=100)
        reads["recent_fetches(box=) of a box not in it"] = lambda: store.recent_fetches(box="gone", limit=100)
        for name, read in reads.items():
            times = []
            for _ in range(args.repeat):
                started = time.perf_counter()
                read()
                times.append(time.perf_counter() - started)
            print(f"{name}: median {statistics.median(times) * 1000:.1f} ms of {args.repeat}")
        store.close()


if __name__ == "__main__":
    main()
