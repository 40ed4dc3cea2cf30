"""Load test of GET /vllm/config: 1,000 boxes fetching at once, cached path vs a naive handler.

    .venv/bin/python bench/config_server_load.py [--boxes 1000] [--concurrency 64] [--rounds 5]

Builds bench/fleetgen's repository of `--boxes` boxes (3 servers each) in a temp git repo, then
for each variant starts a real gunicorn process on a free loopback port and drives it with an
asyncio (aiohttp) client holding `--concurrency` connections, every box fetching its own JSON:

- cached: `fleetllm serve` as shipped (one gthread worker; the commit is rendered once at start-up,
  every request still authenticates, resolves the host, writes the fetch log and a JSON log line);
- naive: the same gunicorn settings and the same auth and host rules, but each request opens the
  repository, reads the commit, validates it and renders the box (what a handler without the
  per-commit cache does);
- constant (with `--floor`): the same gunicorn settings and a handler that returns fixed bytes,
  i.e. what the WSGI server itself costs on this machine at that moment.

`--compare-state` measures the cached server twice instead, once with each state store: the SQLite
file (the default) and PostgreSQL (FLEETLLM_BENCH_PG_URL, or a throwaway cluster started for the run
as tests/state/postgres.py does), every fetch recorded in it; after each run the records in the store
are counted against the requests answered.

`--client wrk` drives the same requests with wrk (Debian's `wrk` package, a Lua script cycling
through the boxes) instead: a C load generator leaves the second core to the server, where the
Python client takes most of it. Prints requests/s and latency percentiles per variant, and the
machine's load average. Bounded: at most `--rounds` x boxes requests or `--cached-seconds` (cached)
and `--naive-seconds` (naive) of load, loopback only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.fleetgen import box_name, write_fleet
from fleetllm.demo.procs import free_port, stop

FLEET_KEY = "bench-fleet-key-0123456789"
ENV = {"BENCH_FLEET_KEY": FLEET_KEY, "BENCH_SALT": "bench-salt-0123456789abcdef"}


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "bench", "GIT_AUTHOR_EMAIL": "bench@example.invalid",
           "GIT_COMMITTER_NAME": "bench", "GIT_COMMITTER_EMAIL": "bench@example.invalid"}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env=env).stdout.strip()


def make_fleet(directory: Path, boxes: int) -> Path:
    """bench/fleetgen's repository (3 servers per box) committed to a fresh git repo."""
    repo = write_fleet(directory / "fleet", boxes)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", f"bench fleet with {boxes} boxes")
    return repo


def write_config(directory: Path, repo: Path, threads: int = 8, state_url: str | None = None,
                 name: str = "control-plane.yaml") -> Path:
    """`state_url` None: a SQLite file in `directory`; a PostgreSQL URL's password goes to the env."""
    state: dict[str, str] = {"url": state_url or f"sqlite:///{directory / 'state.sqlite3'}"}
    if state_url is not None:
        from tests.state.postgres import split_password

        state["url"], password = split_password(state_url)
        if password is not None:
            state["password"] = "${env:BENCH_PG_PASSWORD}"
            ENV["BENCH_PG_PASSWORD"] = password
    config = directory / name
    config.write_text(json.dumps({
        "repo": {"path": str(repo), "branch": "main", "refresh_interval_s": 3600},
        "secrets": {"fleet_key": "${env:BENCH_FLEET_KEY}", "vllm_api_salt": "${env:BENCH_SALT}"},
        "state": state,
        "server": {"threads": threads},
    }))
    return config


def recorded_fetches(config: Path) -> int:
    from fleetllm.adapters.state import open_store
    from fleetllm.settings import load_config

    cp = load_config(config, {**os.environ, **ENV})
    store = open_store(cp.state.url, cp.state.base, password=cp.state.password)
    try:
        return len(store.recent_fetches(limit=10_000_000))
    finally:
        store.close()


def naive_app(config_path: str) -> Any:
    """The strawman: the same rules, but the repository is re-read and re-rendered on every request."""
    from flask import Flask, Response, jsonify, request

    from fleetllm.adapters.git import GitFleetRepo
    from fleetllm.core.fleet.render import Bearers, render_box
    from fleetllm.core.fleet.validate import validate_snapshot
    from fleetllm.core.hosts import resolve_host
    from fleetllm.server.auth import bearer_token, matches
    from fleetllm.settings import load_config

    config = load_config(config_path)
    key = config.secrets.fleet_key
    assert key is not None
    legacy = config.secrets.legacy_api_key.reveal() if config.secrets.legacy_api_key else None
    bearers = Bearers(config.secrets.vllm_api_salt, legacy)
    app = Flask("naive")

    @app.get("/vllm/config")
    def config_route() -> Any:
        if not matches(bearer_token(request.headers.get("Authorization")), key):
            return jsonify({"error": "wrong fleet key"}), 403
        name = resolve_host(request.headers.get("X-LLMAO-Host"), request.headers.get("X-Forwarded-For"),
                            request.remote_addr or "").name
        assert config.repo.path is not None
        fleet = validate_snapshot(GitFleetRepo(config.repo.path).snapshot("refs/heads/main")).fleet
        if fleet is None:
            return jsonify({"error": "invalid"}), 503
        if name not in fleet.boxes:
            return jsonify({"error": "unknown box"}), 404
        body = json.dumps(render_box(fleet, name, bearers), separators=(",", ":"))
        return Response(body, mimetype="application/json", headers={"Cache-Control": "no-store"})

    return app


def constant_app() -> Any:
    from flask import Flask, Response

    app = Flask("constant")
    body = b'{"host":"x","revision":"r","servers":[]}'

    @app.get("/vllm/config")
    def config_route() -> Response:
        return Response(body, mimetype="application/json")

    return app


def serve_variant(variant: str, config_path: str, listen: str) -> None:
    from bench.gunicorn_app import ControlPlaneServer
    from fleetllm.settings import load_config

    load_app = (lambda: naive_app(config_path)) if variant == "naive" else constant_app
    ControlPlaneServer(load_config(config_path), listen, load_app).run()


def start(variant: str, config: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    listen = f"127.0.0.1:{port}"
    if variant == "cached":
        command = [sys.executable, "-m", "fleetllm", "serve", "--config", str(config), "--listen", listen]
    else:
        command = [sys.executable, __file__, "serve-variant", variant, str(config), listen]
    env = {**os.environ, **ENV, "PYTHONPATH": str(ROOT)}
    with log.open("w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"{variant} server exited:\n{log.read_text()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return process
        except OSError:
            time.sleep(0.2)
    stop(process, timeout_s=15)
    raise SystemExit(f"{variant} server did not start within 60 s")


async def load(base: str, boxes: list[str], concurrency: int, max_requests: int, max_seconds: float) -> dict[str, Any]:
    import aiohttp

    queue: asyncio.Queue[str] = asyncio.Queue()
    for i in range(max_requests):
        queue.put_nowait(boxes[i % len(boxes)])
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    deadline = time.monotonic() + max_seconds

    async def worker(session: aiohttp.ClientSession) -> None:
        while time.monotonic() < deadline:
            try:
                box = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            started = time.perf_counter()
            async with session.get(f"{base}/vllm/config", headers={"Authorization": f"Bearer {FLEET_KEY}",
                                                                    "X-LLMAO-Host": box}) as response:
                await response.read()
                statuses[response.status] = statuses.get(response.status, 0) + 1
            latencies.append(time.perf_counter() - started)

    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        began = time.perf_counter()
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
        elapsed = time.perf_counter() - began
    ordered = sorted(latencies)

    def pct(p: float) -> float:
        return ordered[min(len(ordered) - 1, int(p * len(ordered)))] * 1000

    return {"requests": len(latencies), "seconds": round(elapsed, 2), "rps": round(len(latencies) / elapsed, 1),
            "p50_ms": round(pct(0.50), 2), "p99_ms": round(pct(0.99), 2), "max_ms": round(ordered[-1] * 1000, 2),
            "mean_ms": round(statistics.fmean(ordered) * 1000, 2), "statuses": statuses}


WRK_SCRIPT = """
local boxes = {%s}
local n = 0
request = function()
  n = n + 1
  local headers = {["Authorization"] = "Bearer %s", ["X-LLMAO-Host"] = boxes[n %% #boxes + 1]}
  return wrk.format("GET", "/vllm/config", headers)
end
"""
_UNITS = {"us": 0.001, "ms": 1.0, "s": 1000.0}


def wrk_load(base: str, boxes: list[str], concurrency: int, seconds: float, directory: Path) -> dict[str, Any]:
    script = directory / "boxes.lua"
    script.write_text(WRK_SCRIPT % (", ".join(f'"{b}"' for b in boxes), FLEET_KEY))
    out = subprocess.run(["wrk", "-t2", f"-c{concurrency}", f"-d{int(seconds)}s", "--timeout", "120s", "--latency",
                          "-s", str(script), f"{base}/vllm/config"], capture_output=True, text=True, check=True,
                         timeout=seconds + 180).stdout

    def latency(label: str) -> float:
        match = re.search(rf"^\s*{label}\s+([0-9.]+)(us|ms|s)\s*$", out, re.MULTILINE)
        return round(float(match.group(1)) * _UNITS[match.group(2)], 2) if match else float("nan")

    requests = re.search(r"([0-9]+) requests in ([0-9.]+)(m?s)", out)
    rps = re.search(r"Requests/sec:\s+([0-9.]+)", out)
    non_2xx = re.search(r"Non-2xx or 3xx responses: ([0-9]+)", out)
    return {"requests": int(requests.group(1)) if requests else 0, "rps": float(rps.group(1)) if rps else 0.0,
            "p50_ms": latency("50%"), "p99_ms": latency("99%"), "non_2xx": int(non_2xx.group(1)) if non_2xx else 0}


def loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def compare_state(args: argparse.Namespace) -> None:
    from tests.state.postgres import database_url, schema_url

    boxes = [box_name(i) for i in range(args.boxes)]
    with tempfile.TemporaryDirectory(prefix="fleetllm-bench-") as tmp, \
            database_url() as pg_database:
        if pg_database is None:
            raise SystemExit("no PostgreSQL: apt-get install postgresql, or set FLEETLLM_TEST_PG_URL")
        directory = Path(tmp)
        repo = make_fleet(directory, args.boxes)
        results: dict[str, Any] = {"boxes": args.boxes, "concurrency": args.concurrency, "threads": args.threads,
                                   "cpus": os.cpu_count()}
        for state in ("sqlite", "postgresql"):
            with schema_url(pg_database) as pg_url:
                config = write_config(directory, repo, args.threads, pg_url if state == "postgresql" else None,
                                      f"{state}.yaml")
                port = free_port()
                process = start("cached", config, port, directory / f"{state}.log")
                try:
                    base = f"http://127.0.0.1:{port}"
                    asyncio.run(load(base, boxes, args.concurrency, min(len(boxes), 200), 30))  # warm-up
                    before = loadavg()
                    result = asyncio.run(load(base, boxes, args.concurrency, args.rounds * len(boxes),
                                              args.cached_seconds))
                    result["loadavg_before"], result["loadavg_after"] = before, loadavg()
                finally:
                    stop(process, timeout_s=15)  # a graceful stop writes out the buffered fetch records
                result["recorded"] = recorded_fetches(config)
                result["answered"] = result["requests"] + min(len(boxes), 200)
                results[state] = result
            print(f"{state:10} {json.dumps(result)}", flush=True)
    print(json.dumps(results, indent=2))


def run(args: argparse.Namespace) -> None:
    if args.compare_state:
        compare_state(args)
        return
    boxes = [box_name(i) for i in range(args.boxes)]
    with tempfile.TemporaryDirectory(prefix="fleetllm-bench-") as tmp:
        directory = Path(tmp)
        repo = make_fleet(directory, args.boxes)
        config = write_config(directory, repo, args.threads)
        results: dict[str, Any] = {"boxes": args.boxes, "concurrency": args.concurrency, "client": args.client,
                                   "threads": args.threads,
                                   "cpus": os.cpu_count(), "loadavg_before": loadavg()}
        plan = {"cached": (args.rounds * len(boxes), args.cached_seconds),
                "naive": (args.rounds * len(boxes), args.naive_seconds)}
        if args.floor:
            plan["constant"] = plan["cached"]
        for variant, (requests, seconds) in plan.items():
            port = free_port()
            process = start(variant, config, port, directory / f"{variant}.log")
            try:
                base = f"http://127.0.0.1:{port}"
                asyncio.run(load(base, boxes, args.concurrency, min(len(boxes), 200), 30))  # warm-up
                if args.client == "wrk":
                    results[variant] = wrk_load(base, boxes, args.concurrency, seconds, directory)
                else:
                    results[variant] = asyncio.run(load(base, boxes, args.concurrency, requests, seconds))
            finally:
                stop(process, timeout_s=15)
            print(f"{variant:7} {json.dumps(results[variant])}", flush=True)
        results["loadavg_after"] = loadavg()
        results["speedup"] = round(results["cached"]["rps"] / results["naive"]["rps"], 1)
    print(json.dumps(results, indent=2))


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "serve-variant":
        serve_variant(sys.argv[2], sys.argv[3], sys.argv[4])
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--boxes", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5, help="fetches per box on the cached path")
    parser.add_argument("--client", choices=("aiohttp", "wrk"), default="aiohttp")
    parser.add_argument("--cached-seconds", type=float, default=60, help="cap (aiohttp) or duration (wrk)")
    parser.add_argument("--naive-seconds", type=float, default=30)
    parser.add_argument("--threads", type=int, default=8, help="gunicorn request threads (server.threads)")
    parser.add_argument("--floor", action="store_true", help="also measure a constant handler (the server's floor)")
    parser.add_argument("--compare-state", action="store_true",
                        help="the cached server with the SQLite and with the PostgreSQL state store")
    run(parser.parse_args())


if __name__ == "__main__":
    main()
