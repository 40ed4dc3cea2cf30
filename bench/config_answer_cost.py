"""Where the CPU of a cached GET /vllm/config goes: the event-loop answer, in-process, part by part.

    .venv/bin/python bench/config_answer_cost.py [--boxes 1000] [--requests 20000] [--rounds 5]

Builds bench/fleetgen's fleet of `--boxes` boxes in a temp git repo, starts the control plane's
runtime as `fleetllm serve` does (server/runtime.start_up, a SQLite state store, the buffered JSON
log to /dev/null) and calls the shipped event-loop path (server/boxloop.BoxLoop.answer) on requests
as the HTTP server parses them, every box fetching its own JSON; of each answer only the status is
kept. No socket, no HTTP parsing or writing: what is left is the contract's own work, which
bench/config_server_load.py's `cached` pays over its `floor`. Variants, in turn, the order
reversed every other round:

- full: as shipped (key check, host resolution, the answer, the counter, the fetch record, the
  `box request` log line);
- no-log: the `fleetllm` loggers at WARNING, so no `box request` line is written;
- no-fetch: the state store's record_fetches does nothing, so no fetch record is kept or written;
- neither: both;
- bare: the answer `floor` returns (the same bytes and headers, nothing else).

Prints, per variant, the process's CPU per request (every thread: the log writer's and the fetch
log's included; both are flushed before a variant's figure is taken) as min / median / max over the
rounds, and fails when an answer is not 200 or a request was left to the WSGI app.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.config_server_load import ENV, FLEET_KEY, cached_headers, make_fleet, write_config
from bench.fleetgen import box_name
from bench.procstat import task_seconds

VARIANTS = ("full", "no-log", "no-fetch", "neither", "bare")


def thread_cpu() -> dict[str, float]:
    """CPU seconds so far of each thread of this process, by thread name (bench.procstat, per task, to the
    nanosecond)."""
    import threading

    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, float] = {}
    for task in os.listdir("/proc/self/task"):
        name = names.get(int(task), "other")
        name = "main" if name == "MainThread" else name if name.startswith("fleetllm-") else "other"
        name = "fleetllm-request" if name.startswith("fleetllm-request") else name
        out[name] = out.get(name, 0.0) + task_seconds(int(task))
    return out


def requests(boxes: int) -> list[Any]:
    from tests.support.plane_thread import detached_request

    return [detached_request("/vllm/config", [("Host", "127.0.0.1:8080"), ("Authorization", f"Bearer {FLEET_KEY}"),
                                              ("X-LLMAO-Host", box_name(i)), ("Accept-Encoding", "gzip, deflate"),
                                              ("User-Agent", "bench")])
            for i in range(boxes)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--boxes", type=int, default=1000)
    parser.add_argument("--requests", type=int, default=20000, help="per variant a round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--turn", type=int, default=64,
                        help="answers a turn of the event loop (the server records them at its end); at 64 "
                             "connections bench/config_server_load.py's server answers about 63 a turn")
    args = parser.parse_args()
    os.environ.update(ENV)

    from fleetllm.adapters.state.sqlstore import SqlStateStore
    from fleetllm.logs import setup_logging
    from fleetllm.server.boxloop import BoxLoop
    from fleetllm.server.rollouts import release_cache
    from fleetllm.server.runtime import start_up
    from fleetllm.settings import load_config
    from fleetllm_gateway.httpserver import Response

    directory = Path(tempfile.mkdtemp(prefix="fleetllm-bench-"))
    config = load_config(write_config(directory, make_fleet(directory, args.boxes)))
    setup_logging(open(os.devnull, "w"), buffered=True)  # noqa: SIM115 (the log's stream, for the run)
    runtime = start_up(config)
    executor = concurrent.futures.ThreadPoolExecutor(config.threads, thread_name_prefix="fleetllm-request")
    loop = BoxLoop(runtime, executor)
    statuses: dict[int, int] = {}
    batch = requests(args.boxes)
    served = runtime.tracker.served
    assert served is not None
    body = served.boxes[box_name(0)].body
    fleet_logger = logging.getLogger("fleetllm")
    store = runtime.store
    assert isinstance(store, SqlStateStore)  # the SQLite file of write_config
    record_fetches = store.record_fetches
    left_to_app = read_again = 0

    def answer(request: Any) -> None:
        nonlocal left_to_app, read_again
        response = loop.answer(request)
        if response is None:  # the view of the releases expired since the loop below looked
            read_again += 1
            release_cache(runtime).get()
            response = loop.answer(request)
        if response is None:
            left_to_app += 1
        else:
            statuses[response.status] = statuses.get(response.status, 0) + 1

    constant = Response(200, body, cached_headers(body))

    def bare(request: Any) -> None:
        response = constant
        statuses[response.status] = statuses.get(response.status, 0) + 1

    def measure(variant: str) -> tuple[float, dict[str, float]]:
        fleet_logger.setLevel(logging.WARNING if variant in ("no-log", "neither") else logging.INFO)
        setattr(store, "record_fetches",  # noqa: B010 (replaced for the run, a method)
                (lambda fetches: None) if variant in ("no-fetch", "neither") else record_fetches)
        call: Callable[[Any], None] = bare if variant == "bare" else answer
        cache = release_cache(runtime)
        before = thread_cpu()
        started = time.process_time()

        async def turns() -> None:  # on an event loop, as the server: a turn's answers are recorded at its end
            for i in range(args.requests):
                if not cache.fresh():
                    # Read here when it expires: the server's loop lets the background read have the GIL at
                    # each syscall, but this loop makes none, and would keep it from the GIL for a second.
                    cache.get()
                call(batch[i % len(batch)])
                if i % args.turn == args.turn - 1:
                    await asyncio.sleep(0)

        asyncio.run(turns())
        store.flush()
        for handler in fleet_logger.handlers:
            handler.flush()
        spent = (time.process_time() - started) / args.requests * 1e6
        after = thread_cpu()
        return spent, {k: (v - before.get(k, 0.0)) / args.requests * 1e6 for k, v in after.items()}

    figures: dict[str, list[float]] = {v: [] for v in VARIANTS}
    threads: dict[str, dict[str, list[float]]] = {v: {} for v in VARIANTS}
    print(f"{args.boxes} boxes, {args.requests} requests a variant a round, {args.rounds} rounds, "
          f"{os.cpu_count()} CPUs; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for n in range(args.rounds):
        for variant in VARIANTS if n % 2 == 0 else reversed(VARIANTS):
            spent, by_thread = measure(variant)
            figures[variant].append(spent)
            for name, value in by_thread.items():
                threads[variant].setdefault(name, []).append(value)
    fleet_logger.setLevel(logging.INFO)
    print(f"CPU per request, us, min / median / max over {args.rounds} rounds "
          f"(load average now {' '.join(f'{x:.2f}' for x in os.getloadavg())}):")
    for variant in VARIANTS:
        values = figures[variant]
        split = ", ".join(f"{name} {statistics.median(v):.1f}" for name, v in sorted(threads[variant].items())
                          if statistics.median(v) > 0)
        print(f"  {variant:9s} {min(values):7.1f} / {statistics.median(values):7.1f} / {max(values):7.1f}"
              f"   by thread (median): {split}")
    print(f"answers: {statuses}; answered after reading the releases again: {read_again}; "
          f"left to the app even then: {left_to_app}")
    executor.shutdown()
    runtime.stop()
    if set(statuses) != {200} or left_to_app:
        raise SystemExit("FAILED: an answer was not 200, or a request was left to the app (see above)")


if __name__ == "__main__":
    main()
