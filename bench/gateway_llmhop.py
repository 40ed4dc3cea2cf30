"""The gateway against LLMhop (the Go router it is compatible with) on the same upstream, runs interleaved.

    python bench/gateway_llmhop.py --llmhop PATH [--rounds 5] [--seconds 4] [--connections 32,8,1]
                                   [--workers N] [--sse-rounds 100] [--sse-interval 0.05] [--tree CHECKOUT]
                                   [--gateway-python PYTHON] [--native DIR]

PATH is an LLMhop binary (`go build ./cmd/llmhop` in its source; docs/benchmarks.md says which version and
how it was built here). Starts bench/gateway_upstream.py, LLMhop and the gateway (`python -m
fleetllm_gateway` on `--gateway-python`, this Python unless given; `--workers` its default unless given;
compiled with `--native`, a build of tools/build_gateway_native.py from that tree for that Python version)
on it, both with one model `m`, a bearer checked on every request and every other setting at its default.
Each round runs wrk against the two in turn
(LLMhop first in odd rounds, the gateway first in even ones) at each connection count, the 77-byte
body-routed POST of bench/gateway_bench.py, then the upstream directly at one connection; then the time
to the first SSE event of `--sse-rounds` body-routed POSTs on one keep-alive connection to each, and to
the upstream directly. `--sse-interval` sets the upstream's time between two events (so each SSE request
comes two such gaps after the last one's start, its own path unused meanwhile): 0 sends them back to back,
caches warm.

Printed, min / median / max over the rounds: req/s and the gateway/LLMhop ratio round by round; at one
connection the median latency and what each adds over the upstream in the same round; the SSE first
event's median and p90; for both latencies, the gateway/LLMhop ratio of each round, in how many rounds the
gateway was ahead and a distribution-free 95 % interval for the median ratio; each one's CPU time
per request (utime + stime of its serving processes); RSS and PSS of each serving process at the end; the
load average of every row. Then the issue 28 targets (at least 1.5x at C=32 and 1.2x at C=8 in every
round, added latency at one connection and SSE first event at most LLMhop's, RSS per worker at most 25 MB)
one line each, `met` or `FAIL`; exit 1 when one is missed.
The machine may be shared: the two are measured in turn, so compare them with each other. Not part of CI
(wrk and an LLMhop binary are needed).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.gateway_ab import Measurements, _check_tree, _load
from bench.gateway_bench import TOKEN, body_for, free_port, sse_request, wait_port
from bench.gateway_workers import POST_SCRIPT, memory, spread, start_gateway

NAMES = ("llmhop", "gateway")
RSS_TARGET_KIB = 25_000_000 // 1024  # 25 MB
RATIO_TARGETS = {32: 1.5, 8: 1.2}  # gateway req/s over LLMhop's, in every round


def start_llmhop(binary: str, directory: Path, port: int, upstream_port: int) -> subprocess.Popen[bytes]:
    config = directory / "llmhop.json"
    config.write_text(json.dumps({"listen": f"127.0.0.1:{port}", "authTokens": [TOKEN],
                                  "models": {"m": {"url": f"http://127.0.0.1:{upstream_port}"}}}))
    process = subprocess.Popen([binary, "-config", str(config)], stderr=subprocess.DEVNULL)
    wait_port(port)
    return process


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llmhop", default=os.environ.get("LLMHOP") or shutil.which("llmhop"),
                        help="the LLMhop binary (default: $LLMHOP, else llmhop on PATH)")
    parser.add_argument("--workers", type=int, default=None, help="the gateway's --workers (default: its own)")
    parser.add_argument("--tree", type=Path, default=ROOT,
                        help="the checkout (or `git archive` of gateway/ and contract/) whose gateway runs")
    parser.add_argument("--gateway-python", default=sys.executable,
                        help="the Python that runs the gateway (default: this one), with httptools and uvloop "
                             "installed: a box runs the gateway on its own Python")
    parser.add_argument("--native", type=Path, default=None,
                        help="a build of the gateway's compiled modules (tools/build_gateway_native.py) to run on")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=int, default=4, help="of each wrk run")
    parser.add_argument("--connections", default="32,8,1", help="comma-separated; empty: no wrk runs")
    parser.add_argument("--sse-rounds", type=int, default=100, help="SSE requests per target a round (0: none)")
    parser.add_argument("--sse-interval", type=float, default=None,
                        help="seconds between the upstream's SSE events (default: bench/gateway_upstream.py's)")
    args = parser.parse_args(argv)
    if not args.llmhop:
        print("no LLMhop binary: give --llmhop PATH (docs/benchmarks.md says how to build one)", file=sys.stderr)
        return 2
    if args.connections and shutil.which("wrk") is None:
        print("wrk is not installed: apt-get install -y wrk", file=sys.stderr)
        return 2
    gateway_from = _check_tree(args.tree.resolve(), args.gateway_python, args.native)  # before anything starts
    from fleetllm_gateway.workers import default_workers

    workers = args.workers or default_workers()
    directory = Path(tempfile.mkdtemp(prefix="gw-llmhop-"))
    script = directory / "post.lua"
    script.write_text(POST_SCRIPT % json.dumps(body_for("m")))
    upstream_port = free_port()
    interval = [] if args.sse_interval is None else ["--sse-interval", str(args.sse_interval)]
    upstream = subprocess.Popen([sys.executable, str(ROOT / "bench" / "gateway_upstream.py"), "--tcp",
                                 str(upstream_port), *interval])
    started: list[subprocess.Popen[bytes]] = [upstream]
    ports: dict[str, int] = {name: free_port() for name in NAMES}
    try:
        wait_port(upstream_port)
        procs = {"llmhop": start_llmhop(args.llmhop, directory, ports["llmhop"], upstream_port)}
        started.append(procs["llmhop"])
        procs["gateway"] = start_gateway(directory, "gateway", {
            "host": "127.0.0.1", "port": ports["gateway"], "authTokens": [TOKEN],
            "models": {"m": {"url": f"http://127.0.0.1:{upstream_port}"}}}, workers, args.tree.resolve(),
            args.gateway_python, args.native)
        started.append(procs["gateway"])
        connections = [int(c) for c in args.connections.split(",") if c]
        runs = f"{args.seconds} s per wrk run" if connections else "no wrk runs"
        print(f"LLMhop {args.llmhop}; gateway {gateway_from} --workers {workers}; "
              f"{args.rounds} rounds, {runs}; "
              f"{os.cpu_count()} CPUs; load {_load()}", flush=True)
        m = Measurements(NAMES)
        for n in range(args.rounds):
            order = NAMES if n % 2 == 0 else NAMES[::-1]
            m.round(order, {name: (ports[name], procs[name].pid) for name in NAMES}, upstream_port, connections,
                    args.seconds, script, (sse_request(False), sse_request(True)) if args.sse_rounds else None,
                    args.sse_rounds)
            print(f"round {n + 1} done, load {_load()}", flush=True)
        return report(args, connections, m.rps, m.cpu_us, m.p50, m.sse, m.loads,
                      {name: memory(procs[name].pid) for name in NAMES})
    finally:
        for proc in reversed(started):
            proc.terminate()
            proc.wait(timeout=30)
        shutil.rmtree(directory, ignore_errors=True)


def report(args: argparse.Namespace, connections: list[int], rps: dict[tuple[str, int], list[float]],
           cpu_us: dict[tuple[str, int], list[float]], p50: dict[str, list[float]],
           sse: dict[str, list[list[float]]], loads: dict[str, list[str]],
           memories: dict[str, list[tuple[int, int]]]) -> int:
    """Print the figures and the targets' verdicts; 1 when a target is missed."""
    verdicts: list[tuple[str, bool]] = []
    print()
    for c in connections:
        ratios = [g / h for h, g in zip(rps[("llmhop", c)], rps[("gateway", c)], strict=True)]
        print(f"C={c} req/s  LLMhop {spread(rps[('llmhop', c)], ',.0f')} | gateway "
              f"{spread(rps[('gateway', c)], ',.0f')} | gateway/LLMhop {spread(ratios, '.2f')} | "
              f"load {'; '.join(loads[f'C={c}'])}")
        print(f"C={c} CPU µs/request  LLMhop {spread(cpu_us[('llmhop', c)], '.0f')} | "
              f"gateway {spread(cpu_us[('gateway', c)], '.0f')}")
        if c in RATIO_TARGETS:
            verdicts.append((f"C={c}: gateway/LLMhop at least {RATIO_TARGETS[c]}x in every round "
                             f"(lowest {min(ratios):.2f})", min(ratios) >= RATIO_TARGETS[c]))
    added: dict[str, list[float]] = {}
    if p50["direct"]:
        print(f"C=1 median latency µs  direct {spread(p50['direct'], '.0f')}")
        for name in NAMES:
            added[name] = [t - d for t, d in zip(p50[name], p50["direct"], strict=True)]
            print(f"  {name} {spread(p50[name], '.0f')}  added {spread(added[name], '+.0f')}")
        print(f"  added, gateway/LLMhop per round {_ratios(added['gateway'], added['llmhop'])}")
        verdicts.append((f"C=1 added latency at most LLMhop's (medians: gateway "
                         f"{statistics.median(added['gateway']):+.0f} µs, LLMhop "
                         f"{statistics.median(added['llmhop']):+.0f} µs)",
                         statistics.median(added["gateway"]) <= statistics.median(added["llmhop"])))
    if sse["direct"]:
        print(f"SSE first event µs (each round's median and p90), load {'; '.join(loads['SSE'])}")
        medians: dict[str, list[float]] = {}
        for name in ("direct", *NAMES):
            medians[name] = [statistics.median(t) * 1000 for t in sse[name]]
            p90s = [statistics.quantiles(t, n=10)[-1] * 1000 for t in sse[name]]
            print(f"  {name}: median {spread(medians[name], '.0f')}  p90 {spread(p90s, '.0f')}")
        print(f"  median, gateway/LLMhop per round {_ratios(medians['gateway'], medians['llmhop'])}")
        verdicts.append((f"SSE first event at most LLMhop's (medians: gateway "
                         f"{statistics.median(medians['gateway']):.0f} µs, LLMhop "
                         f"{statistics.median(medians['llmhop']):.0f} µs)",
                         statistics.median(medians["gateway"]) <= statistics.median(medians["llmhop"])))
    for name in NAMES:
        rows = memories[name]
        print(f"memory {name}: RSS {', '.join(f'{r / 1024:.1f}' for r, _ in rows)} MiB, "
              f"PSS {', '.join(f'{p / 1024:.1f}' for _, p in rows)} MiB")
    worst = max(r for r, _ in memories["gateway"])
    verdicts.append((f"RSS per gateway worker at most 25 MB (largest {worst * 1024 / 1e6:.1f} MB)",
                     worst <= RSS_TARGET_KIB))
    print(f"load at the end: {_load()}")
    print()
    for text, met in verdicts:
        print(f"{'met ' if met else 'FAIL'} {text}")
    return 0 if all(met for _, met in verdicts) else 1


def _ratios(gateway: list[float], llmhop: list[float]) -> str:
    """min / median / max of the rounds' gateway/LLMhop ratios (lower is better: latencies), in how many
    rounds the gateway was ahead (at most 1), and an interval for the median ratio."""
    ratios = [g / h for g, h in zip(gateway, llmhop, strict=True) if h > 0]
    if not ratios:
        return "n/a"
    ahead = sum(r <= 1 for r in ratios)
    low, high, coverage = median_interval(ratios)
    return (f"{spread(ratios, '.2f')}; gateway ahead in {ahead} of {len(ratios)} rounds; median ratio "
            f"between {low:.2f} and {high:.2f} ({coverage:.0%} interval)")


def median_interval(values: list[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """A distribution-free interval for the median of what `values` sample: the order statistics k and
    n + 1 - k, with the largest k whose coverage (a binomial sum, the rounds taken as independent) is still
    at least `confidence`; with too few values for that, the smallest and largest. Returns (low, high,
    coverage)."""
    ordered, n = sorted(values), len(values)

    def coverage(k: int) -> float:  # P(X_(k) <= median <= X_(n+1-k)), X ~ Binomial(n, 1/2)
        return sum(math.comb(n, i) for i in range(k, n + 1 - k)) / (1 << n)

    k = 1
    while k + 1 <= (n + 1) // 2 and coverage(k + 1) >= confidence:
        k += 1
    return ordered[k - 1], ordered[n - k], coverage(k)


if __name__ == "__main__":
    raise SystemExit(main())
