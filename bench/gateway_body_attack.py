"""One large hostile body against the box gateway: how long /health waits, how much memory the gateway
takes, how long the attacking request itself takes (issue 16, finding 6).

    python bench/gateway_body_attack.py [--root CHECKOUT] [--mib 99] [--shape SHAPE ...]

Starts bench/gateway_upstream.py and the gateway of CHECKOUT (default: this one) with its default
limits and one bearer, then for each shape (naming a model the gateway does not have, so that the
answer is a 404 once the body is read and scanned, and nothing is forwarded): polls GET /health on a
keep-alive connection every 10 ms from a thread while one authenticated POST sends a body of about
--mib MiB, and reports the slowest
and the 99th-percentile /health answer during the attack, the attack's status and duration, and the
gateway's peak RSS (VmHWM of /proc/PID/status, the whole process's lifetime: each shape runs in a
fresh gateway). Shapes:

  none       no attack: /health polled for 3 s (the machine's own noise)
  lists      {"messages": [[],[],...], "model": "absent"}    (the reported attack; empty lists)
  nested     {"model": "absent", "x": [[[[[[]]]]]], ...]}     (small nests, the scanner's slowest shape)
  string     {"model": "absent", "x": "xxxx..."}              (one long string, like a base64 image)
  escapes    {"model": "absent", "x": "\\n\\n..."}            (a string of escapes)
  ints       {"model": "absent", "prompt": [0, 1, 2, ...]}    (token ids)

Not part of CI; docs/benchmarks.md has the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.gateway_bench import gateway_env

TOKEN = "bench-token"


def body(shape: str, mib: int) -> bytes:
    size = mib << 20
    if shape == "none":
        return b""
    if shape == "lists":
        return b'{"messages": [' + b"[]," * (size // 3) + b'[]], "model": "absent"}'
    if shape == "nested":
        return b'{"model": "absent", "x": [' + b"[[[[[[]]]]]]," * (size // 13) + b"[]]}"
    if shape == "string":
        return b'{"model": "absent", "x": "' + b"x" * size + b'"}'
    if shape == "escapes":
        return b'{"model": "absent", "x": "' + b"\\n" * (size // 2) + b'"}'
    if shape == "ints":
        numbers, total, i = [], 0, 0
        while total < size:
            piece = b"%d," % (i % 100_000)
            numbers.append(piece)
            total += len(piece)
            i += 1
        return b'{"model": "absent", "prompt": [' + b"".join(numbers) + b"0]}"
    raise ValueError(shape)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_port(port: int) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"port {port} never opened")


@contextmanager
def gateway(root: Path, directory: Path) -> Iterator[tuple[int, int]]:
    """(gateway port, gateway pid)"""
    upstream_port = free_port()
    upstream = subprocess.Popen([sys.executable, str(ROOT / "bench" / "gateway_upstream.py"),
                                 "--tcp", str(upstream_port), "--unix", str(directory / "up.sock")])
    proc: subprocess.Popen[bytes] | None = None
    try:
        wait_port(upstream_port)
        port = free_port()
        config = {"host": "127.0.0.1", "port": port, "authTokens": [TOKEN],
                  "models": {"m": {"url": f"http://127.0.0.1:{upstream_port}"}}}
        (directory / "gateway.json").write_text(json.dumps(config))
        notify_path = str(directory / "notify.sock")
        if os.path.exists(notify_path):
            os.unlink(notify_path)
        notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        notify.bind(notify_path)
        proc = subprocess.Popen([sys.executable, "-m", "fleetllm_gateway", "--config", str(directory / "gateway.json")],
                                env={**gateway_env(root), "NOTIFY_SOCKET": notify_path},
                                cwd=root, stderr=subprocess.DEVNULL)
        if not select.select([notify], [], [], 30)[0] or notify.recv(64) != b"READY=1":
            raise RuntimeError("the gateway did not report READY=1")
        notify.close()
        yield port, proc.pid
    finally:
        for p in (proc, upstream):
            if p is not None:
                p.terminate()
                p.wait(timeout=15)


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def read_response(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        rest += chunk
    return head


def poll_health(port: int, stop: threading.Event, latencies: list[float]) -> None:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while not stop.is_set():
            started = time.perf_counter()
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: gw\r\n\r\n")
            read_response(sock)
            latencies.append((time.perf_counter() - started) * 1000)
            time.sleep(0.01)


def attack(port: int, payload: bytes) -> tuple[str, float]:
    started = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer " + TOKEN.encode()
                     + b"\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(payload))
        sock.sendall(payload)
        head = read_response(sock)
    status = head.split(b"\r\n", 1)[0].decode(errors="replace").partition(" ")[2] or "closed"
    return status, time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout whose gateway runs")
    parser.add_argument("--mib", type=int, default=99)
    parser.add_argument("--shape", action="append", choices=["none", "lists", "nested", "string", "escapes", "ints"])
    args = parser.parse_args(argv)
    shapes = args.shape or ["none", "lists", "nested", "string", "escapes", "ints"]
    print(f"gateway from {args.root}, load average {os.getloadavg()[0]:.1f}", flush=True)
    print("| body | size | answer | attack took | /health p99 during | /health slowest | gateway peak RSS |")
    print("|---|---|---|---|---|---|---|")
    for shape in shapes:
        payload = body(shape, args.mib)
        with tempfile.TemporaryDirectory(prefix="gw-attack-") as tmp, gateway(args.root, Path(tmp)) as (port, pid):
            idle = peak_rss_mib(pid)
            latencies: list[float] = []
            stop = threading.Event()
            poller = threading.Thread(target=poll_health, args=(port, stop, latencies))
            poller.start()
            time.sleep(0.3)
            if payload:
                status, took = attack(port, payload)
            else:
                time.sleep(3)
                status, took = "-", 0.0
            stop.set()
            poller.join()
            ordered = sorted(latencies)
            p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
            print(f"| {shape} | {len(payload) / 2**20:.0f} MiB | {status} | {took:.1f} s | {p99:.0f} ms | "
                  f"{max(latencies):.0f} ms | {peak_rss_mib(pid):.0f} MiB (idle {idle:.0f}) |", flush=True)
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
