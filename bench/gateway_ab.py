"""Two versions of the gateway side by side (A: an older source tree, B: this one), runs interleaved, with `wrk`.

    git archive main gateway contract | tar -x -C /tmp/gw-before
    python bench/gateway_ab.py --before /tmp/gw-before [--pairs 3] [--seconds 3] [--connections 1,32]
                               [--sse-rounds 60] [--sse-routing path|body]
                               [--before-python PYTHON] [--after-python PYTHON]
                               [--before-native DIR] [--after-native DIR]

Starts bench/gateway_upstream.py and two gateways on it, one from each tree (PYTHONPATH pointed at its
`gateway/` and `contract/`), with the config of bench/gateway_workers.py (a bearer, one TCP model, a
per-model limit of 1024). Each pair runs wrk against A then B, or B then A (alternating), for every
connection count, then the upstream directly at one connection, then the SSE time to first event on
each. Printed: min / median / max over the pairs of req/s, of the median latency at one connection
(and of what each gateway adds over the upstream, pair by pair), of the SSE first event's median and
p90, the gateway's CPU time per request (utime + stime of its serving processes over each run: steadier
than latency on a shared machine), the load average around every row, and RSS and PSS of each
serving process at the end. The machine may be shared: compare A with B, not with other tables. Not
part of CI. `--before-python` / `--after-python` run a gateway on another interpreter (one with httptools
and uvloop installed): the same tree twice then compares two builds of Python. `--before-native` /
`--after-native` run one on a build of its compiled modules (tools/build_gateway_native.py, from that
tree for that Python version): the same tree twice then compares it compiled with its Python modules.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.gateway_bench import TOKEN, body_for, first_event_ms, free_port, gateway_env, sse_request, wait_port
from bench.gateway_workers import POST_SCRIPT, memory, spread, start_gateway, wrk
from bench.procstat import cpu_seconds


def _check_tree(tree: Path, python: str = sys.executable, native: Path | None = None) -> str:
    """The file fleetllm_gateway is imported from with `tree`'s PYTHONPATH (it must be inside `tree`), the
    interpreter that runs it, and whether its request path is compiled (it must be when `native` is given:
    a build that does not fit is refused here, with the reason)."""
    check = "import fleetllm_gateway, httptools, sys; print(fleetllm_gateway.__file__); print(sys.version.split()[0])"
    if native:
        check += "; from fleetllm_gateway.native import STATUS as s; print('' if s.compiled else s.reason)"
    result = subprocess.run([python, "-c", check], env=gateway_env(tree, native), capture_output=True, text=True)
    if result.returncode:
        raise SystemExit(f"{python} cannot run the gateway of {tree} (it needs httptools, and uvloop to compare "
                         f"like with like): {(result.stderr.strip().splitlines() or [''])[-1]}")
    out, version, *reason = result.stdout.splitlines()
    if not out.startswith(str(tree.resolve())):
        raise SystemExit(f"{tree}: fleetllm_gateway is imported from {out}, not from the tree")
    if native and reason and reason[0]:
        raise SystemExit(f"{tree}: the build {native} is not used: {reason[0]}")
    return f"{out}, Python {version} ({python}), " + (f"compiled ({native})" if native else "Python modules")


def _serving(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()] or [pid]


def _load() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


class Measurements:
    """What the gateway benches measure of each target, round by round: req/s and CPU µs per request per
    (target, connections), the median latency at one connection (the upstream's own as "direct"), the SSE
    first events, and the load average before every row."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.rps: dict[tuple[str, int], list[float]] = {}
        self.cpu_us: dict[tuple[str, int], list[float]] = {}  # CPU time of its serving processes per request
        self.p50: dict[str, list[float]] = {"direct": [], **{name: [] for name in names}}
        self.sse: dict[str, list[list[float]]] = {"direct": [], **{name: [] for name in names}}
        self.loads: dict[str, list[str]] = {}

    def round(self, order: tuple[str, ...], targets: dict[str, tuple[int, int]], upstream_port: int,
              connections: list[int], seconds: int, script: Path, sse: tuple[bytes, bytes] | None,
              sse_rounds: int) -> None:
        """One round: wrk against each target of `targets` (name: port, pid) in `order` at every connection
        count, the upstream directly at one connection, then `sse` (the upstream's request, the targets')."""
        for c in connections:
            self.loads.setdefault(f"C={c}", []).append(_load())
            for name in order:
                port, pid = targets[name]
                pids = _serving(pid)
                before = cpu_seconds(pids)
                result = wrk(port, c, seconds, script)
                spent = cpu_seconds(pids) - before
                self.rps.setdefault((name, c), []).append(result["rps"])
                self.cpu_us.setdefault((name, c), []).append(spent / (result["rps"] * seconds) * 1e6)
                if result.get("non_2xx"):
                    print(f"  {name} C={c}: {result['non_2xx']:.0f} non-2xx", flush=True)
                if c == 1:
                    self.p50[name].append(result["50%"] * 1000)
            if c == 1:
                self.p50["direct"].append(wrk(upstream_port, 1, seconds, script)["50%"] * 1000)
        if sse is not None:
            self.loads.setdefault("SSE", []).append(_load())
            self.sse["direct"].append(first_event_ms(upstream_port, sse[0], sse_rounds))
            for name in order:
                self.sse[name].append(first_event_ms(targets[name][0], sse[1], sse_rounds))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=Path, required=True, help="the A tree (holding gateway/ and contract/)")
    parser.add_argument("--after", type=Path, default=ROOT, help="the B tree (default: this checkout)")
    parser.add_argument("--before-python", default=sys.executable,
                        help="the Python that runs A (default: this one); with httptools and uvloop installed")
    parser.add_argument("--after-python", default=sys.executable, help="the Python that runs B (default: this one)")
    parser.add_argument("--before-native", type=Path, default=None,
                        help="a build of A's compiled modules (tools/build_gateway_native.py) for A to run on")
    parser.add_argument("--after-native", type=Path, default=None, help="the same for B")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=3, help="of each wrk run")
    parser.add_argument("--connections", default="1,32", help="comma-separated; empty: no wrk runs")
    parser.add_argument("--sse-routing", choices=("path", "body"), default="path",
                        help="the SSE requests: GET /route/m/v1/sse, or a POST routed by its body as "
                             "bench/gateway_llmhop.py sends (default: path)")
    parser.add_argument("--sse-rounds", type=int, default=60,
                        help="per gateway and pair (0: none); each takes about 0.1 s (the upstream's 3 events)")
    args = parser.parse_args(argv)
    if args.connections and shutil.which("wrk") is None:
        print("wrk is not installed: apt-get install -y wrk", file=sys.stderr)
        return 2
    trees = {"A": args.before.resolve(), "B": args.after.resolve()}
    pythons = {"A": args.before_python, "B": args.after_python}
    natives = {"A": args.before_native, "B": args.after_native}
    for name, tree in trees.items():
        print(f"{name}: {_check_tree(tree, pythons[name], natives[name])}")
    directory = Path(tempfile.mkdtemp(prefix="gw-ab-"))
    script = directory / "post.lua"
    script.write_text(POST_SCRIPT % json.dumps(body_for("m")))
    upstream_port = free_port()
    upstream = subprocess.Popen([sys.executable, str(ROOT / "bench" / "gateway_upstream.py"), "--tcp",
                                 str(upstream_port)])
    gateways: dict[str, subprocess.Popen[bytes]] = {}
    ports: dict[str, int] = {}
    try:
        wait_port(upstream_port)
        for name, tree in trees.items():
            ports[name] = free_port()
            config = {"host": "127.0.0.1", "port": ports[name], "authTokens": [TOKEN],
                      "models": {"m": {"url": f"http://127.0.0.1:{upstream_port}", "maxConcurrentRequests": 1024}}}
            gateways[name] = start_gateway(directory, name, config, args.workers, tree, pythons[name],
                                           natives[name])
        print(f"{args.pairs} pairs, {args.seconds} s per wrk run, --workers {args.workers}, load {_load()}")
        connections = [int(c) for c in args.connections.split(",") if c]
        m = Measurements(("A", "B"))
        request = b"GET /route/m/v1/sse HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer %b\r\n\r\n" % TOKEN.encode()
        sse_requests = (request.replace(b"/route/m", b""), request) if args.sse_routing == "path" else \
            (sse_request(False), sse_request(True))
        for pair in range(args.pairs):
            order = ("A", "B") if pair % 2 == 0 else ("B", "A")
            m.round(order, {name: (ports[name], gateways[name].pid) for name in order}, upstream_port,
                    connections, args.seconds, script,
                    sse_requests if args.sse_rounds else None, args.sse_rounds)
            print(f"pair {pair + 1} done, load {_load()}", flush=True)
        print()
        rps, cpu_us, p50, sse, loads = m.rps, m.cpu_us, m.p50, m.sse, m.loads
        for c in connections:
            a, b = rps[("A", c)], rps[("B", c)]
            ratios = [y / x for x, y in zip(a, b, strict=True)]
            print(f"C={c} req/s  A {spread(a, ',.0f')} | B {spread(b, ',.0f')} | B/A {spread(ratios, '.2f')}"
                  f" | load {'; '.join(loads[f'C={c}'])}")
            print(f"C={c} gateway CPU µs/request  A {spread(cpu_us[('A', c)], '.0f')} | "
                  f"B {spread(cpu_us[('B', c)], '.0f')}")
        if p50["direct"]:
            print(f"C=1 median latency µs  direct {spread(p50['direct'], '.0f')}")
            for name in ("A", "B"):
                added = [g - d for g, d in zip(p50[name], p50["direct"], strict=True)]
                print(f"  {name} {spread(p50[name], '.0f')}  added {spread(added, '+.0f')}")
        if sse["direct"]:
            print(f"SSE first event µs (per-pair median and p90), load {'; '.join(loads['SSE'])}")
            for name in ("direct", "A", "B"):
                medians = [statistics.median(t) * 1000 for t in sse[name]]
                p90s = [statistics.quantiles(t, n=10)[-1] * 1000 for t in sse[name]]
                print(f"  {name}: median {spread(medians, '.0f')}  p90 {spread(p90s, '.0f')}")
        for name in ("A", "B"):
            rows = memory(gateways[name].pid)
            print(f"memory {name}: RSS {', '.join(f'{r / 1024:.1f}' for r, _ in rows)} MiB, "
                  f"PSS {', '.join(f'{p / 1024:.1f}' for _, p in rows)} MiB")
        print(f"load at the end: {_load()}")
    finally:
        for proc in (*gateways.values(), upstream):
            proc.terminate()
            proc.wait(timeout=30)
        shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
