"""The gateway with one worker against N workers, side by side, with `wrk` (`apt-get install -y wrk`).

    python bench/gateway_workers.py [--workers N] [--seconds 5] [--rounds 5] [--connections 1,8,32]
    python bench/gateway_workers.py --serve      # start them, print the URLs, wait for Ctrl-C

Starts bench/gateway_upstream.py and two real gateways on it (`--workers 1` and `--workers N`, N
defaulting to the CPUs), each with the same config: a bearer, one TCP model, a per-model limit of
`--limit` (default 1024, on: its shared semaphore is exercised). Every row runs wrk for `--seconds`
(a 77-byte POST, body-routed) against the two gateways in turn, in alternating order (A B, B A, ...),
so each round gives a ratio N/1 of runs taken seconds apart. Printed per row: min / median / max over
the rounds of req/s and of the ratio, the median and p99 latency at one connection with the upstream's
own (the gateway's added latency), the SSE time to first event, RSS and PSS per serving process, and
the load average before and after every row: the machine is shared, so read ratios, not absolute
figures. Not part of CI.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.gateway_bench import TOKEN, _ms, body_for, first_event_ms, free_port, gateway_env, load_average, wait_port

POST_SCRIPT = """wrk.method = "POST"
wrk.body = %s
wrk.headers["Content-Type"] = "application/json"
"""


def start_gateway(directory: Path, name: str, config: dict[str, object], workers: int,
                  tree: Path = ROOT, python: str = sys.executable,
                  native: Path | None = None) -> subprocess.Popen[bytes]:
    path = directory / f"{name}.json"
    path.write_text(json.dumps(config))
    notify_path = str(directory / f"{name}.notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify:
        notify.bind(notify_path)
        env = {**gateway_env(tree, native), "NOTIFY_SOCKET": notify_path}
        proc = subprocess.Popen([python, "-m", "fleetllm_gateway", "--config", str(path), "--workers",
                                 str(workers)], env=env)
        if not select.select([notify], [], [], 60)[0] or notify.recv(64) != b"READY=1":
            proc.kill()
            raise RuntimeError(f"the gateway with {workers} workers did not report READY=1")
    return proc


@contextmanager
def fleet(directory: Path, workers: int, limit: int) -> Iterator[tuple[int, dict[int, tuple[int, int]]]]:
    """The upstream's port, and {workers: (gateway port, pid)} for 1 and `workers` workers."""
    upstream_port = free_port()
    upstream = subprocess.Popen([sys.executable, str(ROOT / "bench" / "gateway_upstream.py"), "--tcp",
                                 str(upstream_port), "--unix", str(directory / "up.sock")])
    gateways: dict[int, subprocess.Popen[bytes]] = {}
    ports: dict[int, tuple[int, int]] = {}
    try:
        wait_port(upstream_port)
        for count in (1, workers):
            port = free_port()
            config = {"host": "127.0.0.1", "port": port, "authTokens": [TOKEN],
                      "models": {"m": {"url": f"http://127.0.0.1:{upstream_port}", "maxConcurrentRequests": limit}}}
            gateways[count] = start_gateway(directory, f"gw{count}", config, count)
            ports[count] = (port, gateways[count].pid)
        yield upstream_port, ports
    finally:
        for proc in (*gateways.values(), upstream):
            proc.terminate()
            proc.wait(timeout=30)


def wrk(port: int, connections: int, seconds: int, script: Path) -> dict[str, float]:
    threads = 1 if connections == 1 else 2
    command = ["wrk", f"-t{threads}", f"-c{connections}", f"-d{seconds}s", "--latency", "-s", str(script),
               "-H", f"Authorization: Bearer {TOKEN}", f"http://127.0.0.1:{port}/v1/chat/completions"]
    output = subprocess.run(command, capture_output=True, text=True, check=True).stdout

    result: dict[str, float] = {}
    for line in output.splitlines():
        fields = line.split()
        if line.startswith("Requests/sec:"):
            result["rps"] = float(fields[1])
        elif fields[:1] in (["50%"], ["99%"]):
            result[fields[0]] = _ms(fields[1])
        elif line.strip().startswith("Non-2xx"):
            result["non_2xx"] = float(fields[-1])
    return result


def spread(values: list[float], fmt: str) -> str:
    return " / ".join(format(v, fmt) for v in (min(values), statistics.median(values), max(values)))


def memory(pid: int) -> list[tuple[int, int]]:
    """(RSS, PSS) in KiB of each serving process: the workers, or the gateway alone."""
    children = [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()] or [pid]
    out = []
    for child in children:
        rollup = {line.split(":")[0]: int(line.split()[1]) for line in
                  Path(f"/proc/{child}/smaps_rollup").read_text().splitlines()[1:]}
        out.append((rollup["Rss"], rollup["Pss"]))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--seconds", type=int, default=5, help="of each wrk run")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--connections", default="1,8,32")
    parser.add_argument("--limit", type=int, default=1024, help="the model's maxConcurrentRequests (0: none)")
    parser.add_argument("--sse-rounds", type=int, default=500)
    parser.add_argument("--serve", action="store_true", help="start the processes, print their URLs, wait")
    args = parser.parse_args(argv)
    if shutil.which("wrk") is None:
        print("wrk is not installed: apt-get install -y wrk", file=sys.stderr)
        return 2
    directory = Path(tempfile.mkdtemp(prefix="gw-workers-"))
    script = directory / "count.lua"
    script.write_text(POST_SCRIPT % json.dumps(body_for("m")))
    try:
        with fleet(directory, args.workers, args.limit) as (upstream_port, gateways):
            if args.serve:
                print(f"upstream: http://127.0.0.1:{upstream_port}  wrk script: {script}", flush=True)
                for count, (port, pid) in gateways.items():
                    print(f"{count} worker(s): http://127.0.0.1:{port} (pid {pid})", flush=True)
                with contextlib.suppress(KeyboardInterrupt):
                    while True:
                        time.sleep(3600)
                return 0
            n = args.workers
            print(f"1 vs {n} workers, {args.seconds} s per run, {args.rounds} rounds, limit {args.limit}")
            print("| C | req/s, 1 worker | req/s, N workers | ratio N/1 | non-2xx | load before -> after |")
            print("|---|---|---|---|---|---|")
            latency: dict[int, dict[str, list[float]]] = {1: {"50%": [], "99%": []}, n: {"50%": [], "99%": []}}
            direct: dict[str, list[float]] = {"50%": [], "99%": []}
            for connections in (int(c) for c in args.connections.split(",")):
                before = os.getloadavg()
                rps: dict[int, list[float]] = {1: [], n: []}
                non_2xx = 0.0
                for round_ in range(args.rounds):
                    order = (1, n) if round_ % 2 == 0 else (n, 1)
                    for count in order:
                        result = wrk(gateways[count][0], connections, args.seconds, script)
                        rps[count].append(result["rps"])
                        non_2xx += result.get("non_2xx", 0)
                        if connections == 1:
                            latency[count]["50%"].append(result["50%"])
                            latency[count]["99%"].append(result["99%"])
                    if connections == 1:
                        result = wrk(upstream_port, 1, args.seconds, script)
                        direct["50%"].append(result["50%"])
                        direct["99%"].append(result["99%"])
                ratios = [b / a for a, b in zip(rps[1], rps[n], strict=True)]
                after = os.getloadavg()
                print(f"| {connections} | {spread(rps[1], ',.0f')} | {spread(rps[n], ',.0f')} | "
                      f"{spread(ratios, '.2f')} | {non_2xx:.0f} | {before[0]:.1f} -> {after[0]:.1f} |", flush=True)
            if direct["50%"]:
                print("\n| one connection | median latency | added over the upstream (median) | p99 |")
                print("|---|---|---|---|")
                base = statistics.median(direct["50%"])
                print(f"| upstream directly | {spread([v * 1000 for v in direct['50%']], '.0f')} µs | – | "
                      f"{statistics.median(direct['99%']) * 1000:.0f} µs |")
                for count in (1, n):
                    med = statistics.median(latency[count]["50%"])
                    print(f"| {count} worker(s) | {spread([v * 1000 for v in latency[count]['50%']], '.0f')} µs | "
                          f"{(med - base) * 1000:+.0f} µs | {statistics.median(latency[count]['99%']) * 1000:.0f} µs |")
            sse = b"GET /route/m/v1/sse HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer %b\r\n\r\n" % TOKEN.encode()
            print("\n| SSE time to first event (one keep-alive connection) | median | p90 |")
            print("|---|---|---|")
            direct_sse = first_event_ms(upstream_port, sse.replace(b"/route/m", b""), args.sse_rounds)
            rows = [("upstream directly", direct_sse)]
            rows += [(f"{count} worker(s)", first_event_ms(port, sse, args.sse_rounds))
                     for count, (port, _pid) in gateways.items()]
            for name, timings in rows:
                p90 = statistics.quantiles(timings, n=10)[-1]
                print(f"| {name} | {statistics.median(timings) * 1000:.0f} µs | {p90 * 1000:.0f} µs |")
            print("\n| memory after the rows | RSS per serving process | PSS per serving process |")
            print("|---|---|---|")
            for count, (_port, pid) in gateways.items():
                rows_kib = memory(pid)
                print(f"| {count} worker(s) | {', '.join(f'{r / 1024:.1f}' for r, _ in rows_kib)} MiB | "
                      f"{', '.join(f'{p / 1024:.1f}' for _, p in rows_kib)} MiB |")
            print(f"\nLoad at the end: `{load_average()}`")
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
