"""Slow and idle clients against the real control plane, while boxes fetch their config.

    .venv/bin/python bench/slow_clients.py [--slow 1000] [--addresses 40] [--concurrency 64] [--seconds 20]
                                           [--rate 0] [--boxes 100] [--server-pythonpath DIR] [--single-peer]

Builds bench/fleetgen's repository of `--boxes` boxes in a temp git repo and starts `fleetllm serve` on
a free loopback port. Then, in a second process, holds `--slow` connections open from `--addresses`
loopback source addresses (127.3.N.1, each in a /24 of its own, so the server's per-network cap, 256
connections per /24 by default, does not hold them below `--slow`; `--single-peer`: all from one): half
send nothing, half send a request line and then one header line every 2 s (a slowloris). Whenever the
server closes one, it is opened again at once, so the count stays at `--slow` for the whole run.
Meanwhile `--concurrency` keep-alive connections from 127.0.0.1 fetch GET /vllm/config for random boxes
for `--seconds`, each request with a 5 s client timeout: as fast as they go, or `--rate` requests a
second in all (latency then counted from each request's scheduled instant). The same load runs first
without the slow clients (the baseline).

Prints one JSON object: for each phase, requests answered, req/s, p50/p99/max latency, timeouts and
statuses; from the holder, connections opened and reopened (closed by the server), and refused at
connect; the server's memory (resident and peak). `--server-pythonpath DIR` runs the server from
another checkout (PYTHONPATH=DIR), e.g. a `git worktree` of the commit before the change, for the
before/after figures in docs/benchmarks.md. Loopback only; bounded by `--seconds` per phase.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.boot_storm import FLEET_KEY, SALT, make_repo, raise_open_files
from bench.fleetgen import box_name
from bench.procstat import cpu_seconds

REQUEST_TIMEOUT_S = 5.0


def source(i: int, addresses: int) -> str:
    n = i % addresses
    return f"127.3.{n % 250}.{n // 250 + 1}"


async def hold(port: int, count: int, addresses: int, seconds: float) -> dict[str, int]:
    """Keep `count` slow connections open for `seconds`, reopening each one the server closes."""
    stats = {"opened": 0, "reopened": 0, "connect_failed": 0, "closed_by_server": 0}
    deadline = time.monotonic() + seconds

    async def one(i: int) -> None:
        trickler = i % 2 == 1
        first = True
        while time.monotonic() < deadline:
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port,
                                                               local_addr=(source(i, addresses), 0))
            except OSError:
                stats["connect_failed"] += 1
                await asyncio.sleep(0.5)
                continue
            stats["opened" if first else "reopened"] += 1
            first = False
            try:
                if trickler:
                    writer.write(b"GET /vllm/config HTTP/1.1\r\nHost: x\r\n")
                step = 0
                while time.monotonic() < deadline:
                    try:
                        data = await asyncio.wait_for(reader.read(4096), timeout=2.0)
                    except TimeoutError:
                        if trickler:
                            step += 1
                            writer.write(f"X-Slow-{step}: a\r\n".encode())
                            await writer.drain()
                        continue
                    if not data:
                        stats["closed_by_server"] += 1
                        break
            except (ConnectionError, OSError):
                stats["closed_by_server"] += 1
            finally:
                writer.close()

    await asyncio.gather(*(one(i) for i in range(count)))
    return stats


async def load(base: str, boxes: list[str], concurrency: int, seconds: float, rate: float = 0) -> dict[str, Any]:
    """`concurrency` connections fetching for `seconds`: as fast as they can (rate 0), or `rate` requests
    a second in all, each connection on its own schedule, latency counted from the scheduled instant
    (so a stalled server is not hidden by requests that were never sent)."""
    latencies: list[float] = []
    statuses: dict[str, int] = {}
    timeouts = errors = 0
    deadline = time.monotonic() + seconds
    rng = random.Random(7)

    async def worker(session: aiohttp.ClientSession, n: int) -> None:
        nonlocal timeouts, errors
        interval = concurrency / rate if rate > 0 else 0.0
        scheduled = time.perf_counter() + interval * n / concurrency
        while time.monotonic() < deadline:
            box = rng.choice(boxes)
            if interval:
                await asyncio.sleep(max(0.0, scheduled - time.perf_counter()))
                started = scheduled
                scheduled += interval
            else:
                started = time.perf_counter()
            try:
                async with session.get(f"{base}/vllm/config", headers={"Authorization": f"Bearer {FLEET_KEY}",
                                                                        "X-LLMAO-Host": box}) as response:
                    await response.read()
                    statuses[str(response.status)] = statuses.get(str(response.status), 0) + 1
                latencies.append(time.perf_counter() - started)
            except TimeoutError:
                timeouts += 1
            except (aiohttp.ClientError, OSError):
                errors += 1
                await asyncio.sleep(0.1)

    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    began = time.perf_counter()
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await asyncio.gather(*(worker(session, n) for n in range(concurrency)))
    elapsed = time.perf_counter() - began
    ordered = sorted(latencies)

    def pct(p: float) -> float | None:
        return round(ordered[min(len(ordered) - 1, int(p * len(ordered)))] * 1000, 2) if ordered else None

    return {"answered": len(ordered), "rps": round(len(ordered) / elapsed, 1), "p50_ms": pct(0.50),
            "p99_ms": pct(0.99), "max_ms": round(ordered[-1] * 1000, 2) if ordered else None,
            "mean_ms": round(statistics.fmean(ordered) * 1000, 2) if ordered else None,
            "timeouts": timeouts, "transport_errors": errors, "statuses": statuses}


def open_connections(port: int) -> int:
    """Established TCP connections to the server's port, as the kernel sees them (/proc/net/tcp)."""
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        parts = line.split()
        if int(parts[1].split(":")[1], 16) == port and parts[3] == "01":
            count += 1
    return count


def health_ok(base: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(base + "/health", timeout=REQUEST_TIMEOUT_S) as response:  # noqa: S310
            return bool(response.status == 200)
    except OSError:
        return False


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "hold":
        port, count, addresses, seconds = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
        raise_open_files(2 * count + 256)
        print(json.dumps(asyncio.run(hold(port, count, addresses, seconds))))
        return
    from tests.support.plane import ControlPlane

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--slow", type=int, default=1000)
    parser.add_argument("--addresses", type=int, default=40)
    parser.add_argument("--single-peer", action="store_true")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--rate", type=float, default=0,
                        help="requests a second in all over the connections (0: as fast as they go)")
    parser.add_argument("--boxes", type=int, default=100)
    parser.add_argument("--threads", type=int, default=8, help="server.threads")
    parser.add_argument("--server-pythonpath", help="run the server from this checkout (PYTHONPATH)")
    args = parser.parse_args()
    raise_open_files(2 * (args.slow + args.concurrency) + 256)
    boxes = [box_name(i) for i in range(args.boxes)]
    with tempfile.TemporaryDirectory(prefix="slow-clients-") as tmp:
        directory = Path(tmp)
        repo = make_repo(directory, args.boxes)
        document = {"repo": {"path": str(repo), "branch": "main", "refresh_interval_s": 3600},
                    "secrets": {"fleet_key": "${env:FK}", "vllm_api_salt": "${env:SALT}"},
                    "state": {"url": f"sqlite:///{directory / 'state.sqlite3'}"}, "server": {"threads": args.threads}}
        env = {"FK": FLEET_KEY, "SALT": SALT, **{k: v for k, v in os.environ.items() if k.startswith("FLEETLLM_")}}
        if args.server_pythonpath:
            env["PYTHONPATH"] = args.server_pythonpath
        plane = ControlPlane(directory / "plane", document, env)
        result: dict[str, Any] = {"slow": args.slow, "addresses": 1 if args.single_peer else args.addresses,
                                  "concurrency": args.concurrency, "seconds": args.seconds, "boxes": args.boxes,
                                  "threads": args.threads,
                                  "server": args.server_pythonpath or "this checkout", "cpus": os.cpu_count()}
        try:
            plane.start(timeout_s=300)
            base = plane.url
            asyncio.run(load(base, boxes, 8, 2))  # warm-up
            result["loadavg_before"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
            result["rate"] = args.rate or "unpaced"
            cpu = cpu_seconds(plane.pids())
            result["baseline"] = asyncio.run(load(base, boxes, args.concurrency, args.seconds, args.rate))
            result["baseline"]["server_cpu_s"] = round(cpu_seconds(plane.pids()) - cpu, 2)
            holder = subprocess.Popen([sys.executable, __file__, "hold", str(plane.port), str(args.slow),
                                       str(1 if args.single_peer else args.addresses), str(args.seconds + 8)],
                                      stdout=subprocess.PIPE, text=True, start_new_session=True)
            try:
                time.sleep(5)  # every slow connection open, the tricklers mid-headers
                result["connections_open_on_server"] = open_connections(plane.port)
                result["rss_with_slow_mib"] = plane.memory().rss_mib
                result["health_during"] = health_ok(base)
                cpu = cpu_seconds(plane.pids())
                result["with_slow_clients"] = asyncio.run(load(base, boxes, args.concurrency, args.seconds,
                                                               args.rate))
                result["with_slow_clients"]["server_cpu_s"] = round(cpu_seconds(plane.pids()) - cpu, 2)
                out, _ = holder.communicate(timeout=args.seconds + 60)
                result["holder"] = json.loads(out.strip().splitlines()[-1]) if out.strip() else None
            finally:
                if holder.poll() is None:
                    holder.kill()
                    holder.wait()
            result["peak_mib"] = plane.memory().peak_mib
            result["loadavg_after"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
        finally:
            plane.stop()
        print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
