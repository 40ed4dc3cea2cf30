"""Load test of GET /vllm/config: 1,000 boxes fetching at once, every variant on the same server.

    .venv/bin/python bench/config_server_load.py [--boxes 1000] [--concurrency 64] [--rounds 3] [--seconds 5]
                                                 [--variants cached,bare,floor,cached-wsgi,constant,naive]

Builds bench/fleetgen's repository of `--boxes` boxes (3 servers each) in a temp git repo, starts
every variant as its own process on a free loopback port, then drives them in turn, `--rounds` rounds
of `--seconds` each, the order reversed every other round (A B C, C B A, ...), with an asyncio
(aiohttp) client holding `--concurrency` keep-alive connections, every box fetching its own JSON.
Each variant's warm-up (one request a connection) runs on the connections it is measured on, so no
connection of the warm-up counts against the server's per-peer cap. Every variant but `bare` runs on
fleetllm's HTTP server (reconciler/fleetllm/server/httpserver.py: its connection caps, deadlines and
body budget, the same settings).

- cached: `fleetllm serve` as shipped: GET /vllm/config answered on the event loop (server/boxloop.py;
  every request authenticates, resolves the host, writes the fetch log and a JSON log line);
- bare (issue 28's reference): a bare Tornado handler writing the same box JSON (box 0's, as rendered)
  with the same headers, and nothing else: no auth, no log, no record, none of fleetllm's limits;
- floor (the floor of `cached` on its own server): fleetllm's HTTP server with a handler returning the
  same bytes and headers, and nothing else;
- cached-wsgi: `cached`'s app with the event-loop path off: every request through the WSGI bridge to
  Flask on a request thread (how `cached` ran before issue 28);
- constant (the floor of the WSGI variants): a Flask view returning the same bytes, through the bridge;
- naive: the same auth and host rules through the bridge, but each request opens the repository, reads
  the commit, validates it and renders the box (what a handler without the per-commit cache does).

Prints one line a variant a round (requests/s, p50/p99/max, statuses, the server's CPU per request
from /proc, the load average), then per variant min/median/max, and the ratios pair by pair in each
round (cached/bare, cached/floor, floor/bare, cached/cached-wsgi, naive/constant) as min/median/max
with the load average at the start and the end.

`--fetch-log-rows N` fills the state store's fetch log with N records before the servers start, as a
control plane that has run a while holds it (its default retention is 200,000 records).

`--compare-state` measures the cached server twice instead, once with each state store: the SQLite
file (the default) and PostgreSQL (FLEETLLM_BENCH_PG_URL, or a throwaway cluster started for the run
as tests/state/postgres.py does), every fetch recorded in it; after each run the records in the store
are counted against the requests answered. Loopback only; bounded by `--seconds` per variant a round.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.fleetgen import box_name, write_fleet
from bench.procstat import cpu_seconds
from fleetllm.demo.procs import free_port, stop

FLEET_KEY = "bench-fleet-key-0123456789"
VARIANTS = ("cached", "bare", "floor", "cached-wsgi", "constant", "naive")
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
        # Every connection of the bench comes from 127.0.0.1: the per-peer cap (64 by default, the
        # bench's own concurrency) is lifted, so a connection of the previous round still being
        # closed never gets a new one refused (and so is the per-network cap, which may not be below it).
        "server": {"threads": threads, "max_connections_per_peer": 1024, "max_connections_per_network": 1024},
    }))
    return config


@contextlib.contextmanager
def state_store(config: Path) -> Iterator[Any]:
    """The state store `config` names, opened as the server opens it, closed after."""
    from fleetllm.adapters.state import open_store
    from fleetllm.settings import load_config

    cp = load_config(config, {**os.environ, **ENV})
    store = open_store(cp.state.url, cp.state.base, password=cp.state.password)
    try:
        yield store
    finally:
        store.close()


def recorded_fetches(config: Path) -> int:
    with state_store(config) as store:
        return len(store.recent_fetches(limit=10_000_000))


def fill_fetch_log(config: Path, rows: int, boxes: int) -> None:
    """`rows` fetch records in the state store before the servers start: the log as a control plane that
    has run a while holds it (its default retention is 200,000), every box's polls in turn."""
    from fleetllm.adapters.state.records import BoxApi, FetchRecord

    if not rows:
        return
    with state_store(config) as store:
        started = time.time() - rows / 100
        for i in range(rows):
            store.record_fetch(FetchRecord(at=started + i / 100, endpoint=BoxApi.CONFIG, status=200,
                                           peer="127.0.0.1", claimed_host=box_name(i % boxes), box=box_name(i % boxes),
                                           revision="0" * 40, replica="bench"))
        store.flush()


def naive_app(config_path: str) -> Any:
    """The strawman: the same rules, but the repository is re-read and re-rendered on every request."""
    from flask import Flask, Response, jsonify, request

    from fleetllm.adapters.git import GitFleetRepo
    from fleetllm.core.fleet.render import Bearers, render_box
    from fleetllm.core.fleet.validate import validate_snapshot
    from fleetllm.core.hosts import resolve_host
    from fleetllm.core.secret import bearer_token, matches
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


BODY_FILE = "box0.json"  # box 0's JSON as rendered: what `bare` and `constant` serve


def write_body(directory: Path, repo: Path, config: Path) -> bytes:
    """Box 0's JSON exactly as the control plane renders it (server/revisions.render_commit)."""
    from fleetllm.adapters.git import GitFleetRepo
    from fleetllm.core.fleet.render import Bearers
    from fleetllm.core.fleet.validate import validate_snapshot
    from fleetllm.server.revisions import render_commit
    from fleetllm.settings import load_config

    salt = load_config(config, {**os.environ, **ENV}).secrets.vllm_api_salt
    fleet = validate_snapshot(GitFleetRepo(repo).snapshot("refs/heads/main")).fleet
    assert fleet is not None
    body = render_commit(fleet, Bearers(salt)).boxes[box_name(0)].body
    (directory / BODY_FILE).write_bytes(body)
    return body


def constant_app(body: bytes) -> Any:
    from flask import Flask, Response

    app = Flask("constant")

    @app.get("/vllm/config")
    def config_route() -> Response:
        return Response(body, mimetype="application/json", headers={"Cache-Control": "no-store"})

    return app


def cached_headers(body: bytes) -> list[tuple[str, str]]:
    """The headers `cached` sends with `body` (its ETag and revision the same length; Content-Length,
    Server and Date added by the server that writes them)."""
    return [("Content-Type", "application/json"), ("ETag", '"0123456789abcdef0123456789abcdef"'),
            ("Cache-Control", "no-store"), ("X-Fleet-Revision", "0" * 40)]


def run_bare(config: Any, listen: Any, body: bytes) -> None:
    """Issue 28's reference: a bare Tornado server (tornado.httpserver.HTTPServer with a plain request
    callback, Tornado's own header and body limits at the control plane's settings) that writes `body`
    with the headers `cached` sends, and nothing else: no auth, no log, no record, no caps."""
    from email.utils import formatdate

    from tornado import httputil
    from tornado.httpserver import HTTPServer

    date = formatdate(usegmt=True)  # fixed: one less thing for the floor to do
    fields = [*cached_headers(body), ("Content-Length", str(len(body))), ("Server", "fleetllm"), ("Date", date)]

    def answer(request: httputil.HTTPServerRequest) -> None:
        out = httputil.HTTPHeaders()
        for name, value in fields:
            out.add(name, value)
        assert request.connection is not None
        request.connection.write_headers(httputil.ResponseStartLine("HTTP/1.1", 200, "OK"), out, chunk=body)
        request.connection.finish()

    async def serve() -> None:
        limits = config.limits
        server = HTTPServer(answer, max_header_size=limits.max_header_bytes,
                            idle_connection_timeout=limits.header_timeout_s, body_timeout=limits.body_timeout_s,
                            max_body_size=64 * 1024, decompress_request=False, xheaders=False)
        server.listen(listen.port, address=listen.host, backlog=1024)
        await asyncio.Event().wait()

    asyncio.run(serve())


def run_floor(config: Any, listen: Any, body: bytes) -> None:
    """The floor of `cached` on its own stack: fleetllm's HTTP server (server/httpserver.py, its caps and
    deadlines at the same settings) with a handler that returns `body` with `cached`'s headers, and nothing
    else (no Host rule, no body read)."""
    from concurrent.futures import ThreadPoolExecutor

    from fleetllm.server.httpserver import listen_on, plane_server
    from fleetllm_gateway.httpserver import Request, Response

    answer = Response(200, body, cached_headers(body))

    async def serve() -> None:
        server = plane_server(config, lambda environ, start_response: [], ThreadPoolExecutor(1), None,
                              config.limits.max_connections)

        async def constant(request: Request) -> Response:
            return answer

        server.handler = constant
        await listen_on(server, listen)
        await asyncio.Event().wait()

    asyncio.run(serve())


def serve_variant(variant: str, config_path: str, listen_at: str) -> None:
    from fleetllm.server import httpserver
    from fleetllm.settings import Listen, load_config

    config = load_config(config_path)
    host, _, port = listen_at.rpartition(":")
    listen = Listen(host, int(port))
    if variant == "cached-wsgi":
        from fleetllm.logs import setup_logging
        from fleetllm.server.app import create_app
        from fleetllm.server.runtime import start_up

        def load_wsgi() -> Any:  # a plain WSGI callable: httpserver then finds no runtime and no event-loop path
            setup_logging(buffered=True)
            runtime = start_up(config)
            runtime.start_background()
            app = create_app(runtime)
            return lambda environ, start_response: app(environ, start_response)

        httpserver.run(config, listen, load_wsgi)
        return
    body = (Path(config_path).parent / BODY_FILE).read_bytes()
    if variant == "bare":
        run_bare(config, listen, body)
        return
    if variant == "floor":
        run_floor(config, listen, body)
        return
    load_app = (lambda: naive_app(config_path)) if variant == "naive" else (lambda: constant_app(body))
    httpserver.run(config, listen, load_app)


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


async def load(base: str, boxes: list[str], concurrency: int, max_requests: int, max_seconds: float,
               warmup: bool = True) -> dict[str, Any]:
    """`concurrency` keep-alive connections fetching box configs, at most `max_requests` or for
    `max_seconds`; first (`warmup`) one request a connection on the same connections, not counted."""
    import aiohttp

    latencies: list[float] = []
    statuses: dict[int, int] = {}
    errors = 0

    async def fetch(session: aiohttp.ClientSession, box: str, counted: bool) -> None:
        nonlocal errors
        started = time.perf_counter()
        try:
            async with session.get(f"{base}/vllm/config", headers={"Authorization": f"Bearer {FLEET_KEY}",
                                                                    "X-LLMAO-Host": box}) as response:
                await response.read()
                status = response.status
        except (TimeoutError, aiohttp.ClientError):
            errors += counted
            return
        if counted:
            statuses[status] = statuses.get(status, 0) + 1
            latencies.append(time.perf_counter() - started)

    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        if warmup:
            await asyncio.gather(*(fetch(session, boxes[i % len(boxes)], False) for i in range(concurrency)))
        queue: asyncio.Queue[str] = asyncio.Queue()
        for i in range(max_requests):
            queue.put_nowait(boxes[i % len(boxes)])
        deadline = time.monotonic() + max_seconds

        async def worker() -> None:
            while time.monotonic() < deadline:
                try:
                    box = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                await fetch(session, box, True)

        began = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - began
    ordered = sorted(latencies) or [float("nan")]

    def pct(p: float) -> float:
        return ordered[min(len(ordered) - 1, int(p * len(ordered)))] * 1000

    return {"requests": len(latencies), "seconds": round(elapsed, 2), "rps": round(len(latencies) / elapsed, 1),
            "p50_ms": round(pct(0.50), 2), "p99_ms": round(pct(0.99), 2), "max_ms": round(ordered[-1] * 1000, 2),
            "mean_ms": round(statistics.fmean(ordered) * 1000, 2), "statuses": statuses, "errors": errors}


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


RATIOS = (("cached", "bare"), ("cached", "floor"), ("floor", "bare"), ("cached", "cached-wsgi"), ("naive", "constant"))


def spread(values: list[float]) -> str:
    ordered = sorted(values)
    return f"{ordered[0]:.2f} / {statistics.median(ordered):.2f} / {ordered[-1]:.2f}" if ordered else "-"


def run(args: argparse.Namespace) -> None:
    if args.compare_state:
        compare_state(args)
        return
    variants = [v for v in args.variants.split(",") if v]
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        raise SystemExit(f"--variants: unknown {', '.join(sorted(unknown))}; choose from {', '.join(VARIANTS)}")
    boxes = [box_name(i) for i in range(args.boxes)]
    with tempfile.TemporaryDirectory(prefix="fleetllm-bench-") as tmp:
        directory = Path(tmp)
        repo = make_fleet(directory, args.boxes)
        config = write_config(directory, repo, args.threads)
        body = write_body(directory, repo, config)
        fill_fetch_log(config, args.fetch_log_rows, args.boxes)
        print(f"{args.boxes} boxes, {args.concurrency} connections, {args.rounds} rounds of {args.seconds:g} s a "
              f"variant, box JSON {len(body)} bytes, {os.cpu_count()} CPUs; load average {loadavg()}", flush=True)
        processes = {}
        try:
            for variant in variants:
                port = free_port()
                processes[variant] = (start(variant, config, port, directory / f"{variant}.log"), port)
            rounds: list[dict[str, dict[str, Any]]] = []
            for n in range(args.rounds):
                order = variants if n % 2 == 0 else list(reversed(variants))
                results: dict[str, dict[str, Any]] = {}
                for variant in order:
                    load1 = os.getloadavg()[0]
                    base = f"http://127.0.0.1:{processes[variant][1]}"
                    cpu = cpu_seconds([processes[variant][0].pid])
                    result = asyncio.run(load(base, boxes, args.concurrency, 10_000_000, args.seconds))
                    cpu = cpu_seconds([processes[variant][0].pid]) - cpu  # the warm-up's requests included
                    result["server_cpu_us"] = round(cpu / (result["requests"] + args.concurrency) * 1e6, 1)
                    result["load1"] = round(load1, 2)
                    results[variant] = result
                    print(f"round {n + 1} {variant:11} {json.dumps(result)}", flush=True)
                rounds.append(results)
        finally:
            for process, _ in processes.values():
                stop(process, timeout_s=15)
    print(f"\nper variant, min / median / max over {args.rounds} rounds (load average now {loadavg()}):")
    for variant in variants:
        rps = [r[variant]["rps"] for r in rounds]
        p99 = [r[variant]["p99_ms"] for r in rounds]
        p50 = [r[variant]["p50_ms"] for r in rounds]
        cpu_us = [r[variant]["server_cpu_us"] for r in rounds]
        print(f"  {variant:11} req/s {spread(rps)}   p50 ms {spread(p50)}   p99 ms {spread(p99)}   "
              f"server CPU per request us {spread(cpu_us)}")
    print("ratios of requests/s, pair by pair in each round, min / median / max:")
    for a, b in RATIOS:
        if a in variants and b in variants:
            ratios = [r[a]["rps"] / r[b]["rps"] for r in rounds if r[b]["rps"]]
            print(f"  {a}/{b}: {spread(ratios)}")
    if "cached" in variants and "bare" in variants:
        worst = min(r["cached"]["rps"] / r["bare"]["rps"] for r in rounds if r["bare"]["rps"])
        p99 = statistics.median(r["cached"]["p99_ms"] for r in rounds)
        loads = ", ".join(f"{r['cached']['load1']:.1f}" for r in rounds)
        verdict = "meets" if worst >= 0.8 and p99 < 50 else "FAILS"
        print(f"{verdict} issue 28's target for cached (at least 0.8x bare in every round, p99 under 50 ms): "
              f"worst ratio {worst:.2f}, median p99 {p99:.1f} ms, load average {loads} at the cached runs")


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "serve-variant":
        serve_variant(sys.argv[2], sys.argv[3], sys.argv[4])
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--boxes", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every variant, in turn")
    parser.add_argument("--seconds", type=float, default=5, help="load per variant a round")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    parser.add_argument("--cached-seconds", type=float, default=60, help="--compare-state: cap per store")
    parser.add_argument("--threads", type=int, default=8, help="request threads (server.threads)")
    parser.add_argument("--fetch-log-rows", type=int, default=0,
                        help="fetch records in the state store before the servers start (its retention: 200000)")
    parser.add_argument("--compare-state", action="store_true",
                        help="the cached server with the SQLite and with the PostgreSQL state store")
    run(parser.parse_args())


if __name__ == "__main__":
    main()
