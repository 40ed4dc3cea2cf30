"""What one GET /metrics costs the control plane's state store: the box freshness series read the fetch log
(per box, the last GET /vllm/config answered 200 or 304), the latest reports and the attention list.

A SQLite store filled with ROWS fetch records over BOXES boxes (a third each 200, 304, 403), then each
read timed REPEAT times; the median is printed. The collector reuses one read for 30 s (BoxFreshness).

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
from fleetllm.adapters.state.store import FetchRetention


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--boxes", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(f"sqlite:///{tmp}/state.db", Path(tmp),
                           retention=FetchRetention(max_rows=args.rows, max_age_s=1e12))
        started = time.perf_counter()
        for i in range(args.rows):
            store.record_fetch(FetchRecord(at=1e9 + i, endpoint=BoxApi.CONFIG, status=(200, 304, 403)[i % 3],
                                           peer="192.0.2.1", box=f"box-{i % args.boxes}", revision="r", replica="a"))
        store.flush()
        print(f"{args.rows} fetch records over {args.boxes} boxes written in {time.perf_counter() - started:.1f} s")
        for name in ("last_config_answered", "latest_reports", "attention"):
            times = []
            for _ in range(args.repeat):
                started = time.perf_counter()
                getattr(store, name)()
                times.append(time.perf_counter() - started)
            print(f"{name}: median {statistics.median(times) * 1000:.1f} ms of {args.repeat}")
        store.close()


if __name__ == "__main__":
    main()
