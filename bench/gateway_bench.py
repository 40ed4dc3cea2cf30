"""Gateway benchmark: throughput and added latency over direct upstream access, with `wrk`.

    apt-get install -y wrk
    python bench/gateway_bench.py [--duration 8] [--out results.md]

Starts bench/gateway_upstream.py (TCP and unix socket) and the real gateway (`python -m fleetllm_gateway`,
uvloop when installed), then measures, like llmhop.md §13 (77-byte POST, 110-byte answer, limit off):

- req/s at 32 connections (wrk -t2): upstream directly, body routing, path routing, unix-socket upstream,
  body routing at 8 connections, and GET /v1/models;
- median latency at 1 connection (wrk -t1 -c1 --latency) for the same routes, and the gateway's
  added median over the direct one;
- SSE time to first event (sequential requests on one keep-alive connection), direct vs gateway.

Other work on the machine skews single runs, so every row is measured in `--rounds` rounds taken in
turn (row 1, row 2, ..., row 1, ...) and the table shows the median round and the best one. The load
average is printed before and after. Not part of CI.
"""

from __future__ import annotations

import argparse
import json
import os
import re
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
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "bench-token"
_MESSAGE = '{"model":"%s","messages":[{"role":"user","content":"hi"}],"max_tokens":1'
_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def gateway_env(tree: Path = ROOT, native: Path | None = None) -> dict[str, str]:
    """The environment that runs the gateway of `tree` (a checkout, or a `git archive` of gateway/ and
    contract/): those two folders first on the path. PYTHONPATH=tree alone is not enough: the venv's
    editable install puts one checkout's gateway/ on the path, and that one would be imported. `native`:
    a build of its compiled modules (tools/build_gateway_native.py) to run on; else none, whatever this
    process's environment says."""
    env = {k: v for k, v in os.environ.items() if k != "FLEETLLM_GATEWAY_NATIVE"}
    if native is not None:
        env["FLEETLLM_GATEWAY_NATIVE"] = str(native.resolve())
    return {**env, "PYTHONPATH": os.pathsep.join(str(tree / part) for part in ("gateway", "contract"))}


def body_for(model: str) -> str:
    text = _MESSAGE % model
    return text + " " * max(0, 76 - len(text)) + "}"  # 77 bytes for model "m", like LLMhop's anchor


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_port(port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


def load_average() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


@dataclass
class WrkResult:
    requests_per_second: float
    median_ms: float | None
    mean_ms: float
    non_2xx: int
    errors: str


def _ms(value: str) -> float:
    match = re.fullmatch(r"([\d.]+)(us|ms|s)", value)
    if not match:
        raise ValueError(value)
    return float(match.group(1)) * _UNITS[match.group(2)]


def wrk(url: str, *, connections: int, threads: int, duration: int, script: Path | None,
        token: str | None = TOKEN) -> WrkResult:
    command = ["wrk", f"-t{threads}", f"-c{connections}", f"-d{duration}s", "--latency"]
    if token:
        command += ["-H", f"Authorization: Bearer {token}"]
    if script:
        command += ["-s", str(script)]
    output = subprocess.run([*command, url], capture_output=True, text=True, check=True).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", output).group(1))  # type: ignore[union-attr]
    mean = _ms(re.search(r"Latency\s+(\S+)", output).group(1))  # type: ignore[union-attr]
    median = re.search(r"^\s+50%\s+(\S+)", output, re.MULTILINE)
    non_2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", output)
    errors = re.search(r"Socket errors:.*", output)
    return WrkResult(rps, _ms(median.group(1)) if median else None, mean, int(non_2xx.group(1)) if non_2xx else 0,
                     errors.group(0) if errors else "")


def post_script(directory: Path, model: str) -> Path:
    path = directory / f"post-{model.replace('/', '_')}.lua"
    path.write_text(f'wrk.method = "POST"\nwrk.body = {json.dumps(body_for(model))}\n'
                    f'wrk.headers["Content-Type"] = "application/json"\n')
    return path


@contextmanager
def processes(directory: Path, workers: int = 1) -> Iterator[tuple[int, int, str]]:
    upstream_port, socket_path = free_port(), str(directory / "up.sock")
    upstream = subprocess.Popen([sys.executable, str(ROOT / "bench" / "gateway_upstream.py"),
                                 "--tcp", str(upstream_port), "--unix", socket_path])
    gateway: subprocess.Popen[bytes] | None = None
    try:
        wait_port(upstream_port)
        gateway_port = free_port()
        config = {"host": "127.0.0.1", "port": gateway_port, "authTokens": [TOKEN], "maxConcurrentRequests": 0,
                  "models": {"m": {"url": f"http://127.0.0.1:{upstream_port}"},
                             "s": {"url": f"unix://{socket_path}"}}}
        (directory / "gateway.json").write_text(json.dumps(config))
        notify_path = str(directory / "notify.sock")
        notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        notify.bind(notify_path)
        gateway = subprocess.Popen([sys.executable, "-m", "fleetllm_gateway", "--config",
                                    str(directory / "gateway.json"), "--workers", str(workers)],
                                   env={**gateway_env(), "NOTIFY_SOCKET": notify_path})
        if not select.select([notify], [], [], 30)[0] or notify.recv(64) != b"READY=1":
            raise RuntimeError("the gateway did not report READY=1")
        notify.close()
        yield upstream_port, gateway_port, socket_path
    finally:
        for proc in (gateway, upstream):
            if proc is not None:
                proc.terminate()
                proc.wait(timeout=15)


def sse_request(with_token: bool) -> bytes:
    """A body-routed POST whose answer is the upstream's SSE stream (LLMhop v1.1.0 routes by body only)."""
    body = json.dumps({"model": "m", "stream": True}).encode()
    auth = b"Authorization: Bearer %b\r\n" % TOKEN.encode() if with_token else b""
    return (b"POST /v1/sse HTTP/1.1\r\nHost: bench\r\n%bContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%b" % (auth, len(body), body))


def first_event_ms(port: int, request: bytes, rounds: int) -> list[float]:
    """Milliseconds from sending each request to its first SSE event, on one keep-alive connection."""
    timings = []
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(rounds):
            started = time.perf_counter()
            sock.sendall(request)
            received = b""
            while b"data:" not in received:
                received += sock.recv(65536)
            timings.append((time.perf_counter() - started) * 1000)
            while not received.endswith(b"0\r\n\r\n"):
                received += sock.recv(65536)
    return timings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sse-rounds", type=int, default=200)
    parser.add_argument("--out", type=Path, help="also write the markdown to this file")
    parser.add_argument("--workers", type=int, default=1,
                        help="the gateway's --workers (default 1, as the figures in docs/benchmarks.md; "
                             "bench/gateway_workers.py compares 1 with N)")
    args = parser.parse_args(argv)
    if shutil.which("wrk") is None:
        print("wrk is not installed: apt-get install -y wrk", file=sys.stderr)
        return 2
    directory = Path(tempfile.mkdtemp(prefix="gw-bench-"))
    lines: list[str] = []
    try:
        before = load_average()
        with processes(directory, args.workers) as (upstream_port, gateway_port, _socket_path):
            direct, gateway = f"http://127.0.0.1:{upstream_port}", f"http://127.0.0.1:{gateway_port}"
            post_m, post_s = post_script(directory, "m"), post_script(directory, "s")
            rows = [
                ("upstream directly", f"{direct}/v1/chat/completions", post_m, 32),
                ("gateway, body routing", f"{gateway}/v1/chat/completions", post_m, 32),
                ("gateway, path routing", f"{gateway}/route/m/v1/chat/completions", post_m, 32),
                ("gateway, unix-socket upstream", f"{gateway}/v1/chat/completions", post_s, 32),
                ("gateway, body routing", f"{gateway}/v1/chat/completions", post_m, 8),
                ("gateway, GET /v1/models", f"{gateway}/v1/models", None, 32),
            ]
            throughput = [[wrk(url, connections=c, threads=2, duration=args.duration, script=script)
                           for name, url, script, c in rows] for _ in range(args.rounds)]
            lines += ["| Target | C | req/s, median round | req/s, best round | mean latency (median round) | "
                      "non-2xx |", "|---|---|---|---|---|---|"]
            for index, (name, _url, _script, connections) in enumerate(rows):
                runs = sorted((r[index] for r in throughput), key=lambda r: r.requests_per_second)
                middle = runs[len(runs) // 2]
                lines.append(f"| {name} | {connections} | {middle.requests_per_second:,.0f} | "
                             f"{runs[-1].requests_per_second:,.0f} | {middle.mean_ms:.2f} ms | "
                             f"{sum(r.non_2xx for r in runs)} {middle.errors} |")
                print(lines[-1], flush=True)
            latency_rows = rows[:4]
            medians = [[wrk(url, connections=1, threads=1, duration=max(3, args.duration // 2), script=script)
                        for _name, url, script, _c in latency_rows] for _ in range(args.rounds)]
            lines += ["", "| Target (1 connection) | median latency (median round) | added over direct |",
                      "|---|---|---|"]
            base = 0.0
            for index, (name, _url, _script, _c) in enumerate(latency_rows):
                median = statistics.median((r[index].median_ms or r[index].mean_ms) for r in medians)
                base = median if index == 0 else base
                added = "–" if index == 0 else f"{(median - base) * 1000:+.0f} µs"
                lines.append(f"| {name} | {median * 1000:.0f} µs | {added} |")
                print(lines[-1], flush=True)
            sse = b"GET /v1/sse HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer %b\r\n\r\n" % TOKEN.encode()
            path_sse = sse.replace(b"/v1/sse", b"/route/m/v1/sse")
            direct_ttfb = first_event_ms(upstream_port, sse, args.sse_rounds)
            gateway_ttfb = first_event_ms(gateway_port, path_sse, args.sse_rounds)
            lines += ["", "| SSE, time to first event | median | p90 |", "|---|---|---|"]
            for name, timings in (("upstream directly", direct_ttfb), ("gateway, path routing", gateway_ttfb)):
                p90 = statistics.quantiles(timings, n=10)[-1]
                lines.append(f"| {name} | {statistics.median(timings) * 1000:.0f} µs | {p90 * 1000:.0f} µs |")
                print(lines[-1], flush=True)
        after = load_average()
        lines += ["", f"Load before: `{before}`", f"Load after: `{after}`"]
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    report = "\n".join(lines) + "\n"
    print("\n" + report)
    if args.out:
        args.out.write_text(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
