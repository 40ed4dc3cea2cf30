"""Outgoing notifications: what `emit` costs the caller (a pass, the revision tracker) and how fast
the sender delivers to a local receiver, deduplicating through a real SQLite state store.

1. emit cost: N emits while the receiver holds every answer (so nothing drains): each call timed;
   the queue is sized to hold them all.
2. delivery: M distinct events to a receiver answering 200 at once (aiohttp on a thread of this
   process), the ledger in a SQLite store: from the first emit until the last one is received.
3. dedup: the same M conditions again: decided against the ledger, none sent.

    .venv/bin/python bench/notify_bench.py --emits 100000 --events 2000
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prometheus_client import CollectorRegistry

from fleetllm.adapters.notify import Delivery, Notifier
from fleetllm.adapters.state import open_store
from fleetllm.adapters.state.notifications import MemoryLedger, SqlLedger
from fleetllm.core.notify import Event, EventKind, Target, TargetKind
from fleetllm.core.secret import Secret
from tests.notify.receiver import receiving


def target(url: str) -> Target:
    return Target("bench", TargetKind.WEBHOOK, Secret(url + "/hook", "u"), frozenset(EventKind))


def sample(registry: CollectorRegistry, name: str) -> float:
    return sum(s.value for m in registry.collect() for s in m.samples if s.name == name)


def emit_cost(count: int) -> dict[str, float]:
    gate = threading.Event()
    with receiving(gate=gate) as receiver:
        sender = Notifier([target(receiver.url)], Delivery(3600, 30, 1, count + 10, True), MemoryLedger(),
                          component="bench", instance="bench")
        times = []
        for i in range(count):
            event = Event(EventKind.ROLLOUT_HALTED, f"r-{i}", "halted", details={"i": i})
            started = time.perf_counter_ns()
            sender.emit(event)
            times.append(time.perf_counter_ns() - started)
        sender.close(0)
        gate.set()
    times.sort()
    return {"emits": count, "median_us": round(statistics.median(times) / 1000, 2),
            "p99_us": round(times[int(len(times) * 0.99)] / 1000, 2), "max_us": round(times[-1] / 1000, 1)}


def delivery(count: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as folder, receiving() as receiver:
        store = open_store(f"sqlite:///{folder}/state.db")
        registry = CollectorRegistry()
        sender = Notifier([target(receiver.url)], Delivery(3600, 30, 3, count + 10, True), SqlLedger(store.db),
                          component="bench", instance="bench", registry=registry)
        events = [Event(EventKind.MODEL_WITHOUT_SERVERS, f"model-{i}", f"model-{i} has no serving server")
                  for i in range(count)]
        started = time.perf_counter()
        sender.settle(EventKind.MODEL_WITHOUT_SERVERS, events)
        receiver.wait_for(count, timeout_s=600)
        sent_s = time.perf_counter() - started
        started = time.perf_counter()
        sender.settle(EventKind.MODEL_WITHOUT_SERVERS, events)  # the same conditions: nothing to send
        sender.close(600)
        dedup_s = time.perf_counter() - started
        store.close()
        return {"events": count, "delivered_s": round(sent_s, 2), "per_s": round(count / sent_s),
                "resent": len(receiver.received) - count, "dedup_pass_s": round(dedup_s, 3),
                "deduplicated": sample(registry, "fleetllm_notifications_deduplicated_total")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--emits", type=int, default=100_000)
    parser.add_argument("--events", type=int, default=2000)
    args = parser.parse_args()
    print(json.dumps({"load": os.getloadavg()[0], "emit": emit_cost(args.emits), "delivery": delivery(args.events)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
