"""One reconcile pass over a synthetic fleet against local fakes (issue 5's scale figure).

N boxes (Vast, one loopback address each: 127.1.x.y), 3 servers per box, 5% of the servers hang
(probe timeouts), 5% answer with another bearer (Foreign). The fakes (a multi-port vLLM stand-in, Vast's
paged listing, LiteLLM's model API over HTTP) run in a separate process; the reconciler runs here.
Two passes: the first creates every deployment, the second is the steady state (nothing to write).
`--state URL` keeps the reconciler's state in a real store (sqlite:///PATH or postgresql://...) instead
of memory: the probe histories of every server are then written after each pass.

    .venv/bin/python bench/reconcile_pass.py --boxes 1000 --probe-concurrency 256 [--state URL]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reconciler.fleet.bearer import Salt
from reconciler.fleet.model import (
    Box,
    Fleet,
    FleetSettings,
    Provider,
    Recipe,
    ReconcileSettings,
    ServerRow,
    VllmRecipe,
    frozen_map,
)
from reconciler.fleet.render import Bearers
from reconciler.reconcile.engine import Reconciler
from reconciler.reconcile.observe.http import RetryPolicy
from reconciler.reconcile.observe.litellm import LitellmClient
from reconciler.reconcile.observe.observer import Observer
from reconciler.reconcile.observe.providers import ProviderAccess, VastClient
from reconciler.reconcile.store import open_store
from reconciler.state.sqlstore import SqlStateStore

SALT = "bench-salt-0123456789abcdef"
PORTS = (8001, 8002, 8003)
MODELS = [f"model-{i}" for i in range(10)]


def box_ip(i: int) -> str:
    return f"127.1.{i // 250}.{i % 250 + 1}"


def plan_servers(boxes: int) -> list[dict[str, Any]]:
    out = []
    for b in range(boxes):
        for j, port in enumerate(PORTS):
            n = b * len(PORTS) + j
            mode = "hang" if n % 20 == 7 else "foreign" if n % 20 == 13 else "ok"
            out.append({"box": box_ip(b), "port": port, "model": MODELS[n % len(MODELS)], "mode": mode})
    return out


async def serve_fakes(spec: dict[str, Any]) -> None:
    from tests.reconcile.fakes import FakeLitellmHttp, FakeServer, FakeVast, FakeVllm, serve, vast_instance

    salt = Salt(SALT)
    vllm = FakeVllm()
    runners = []
    instances: dict[str, dict[int, int]] = {}
    from aiohttp import web

    runner = web.AppRunner(vllm.app(), access_log=None, handler_cancellation=True)
    await runner.setup()
    runners.append(runner)
    for s in spec["servers"]:
        site = web.TCPSite(runner, s["box"], 0, backlog=256)
        await site.start()
        port = int(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
        bearer = salt.derive(s["box"], s["port"]) if s["mode"] != "foreign" else "sk-vllm-someone-else"
        vllm.servers[(s["box"], port)] = FakeServer(s["model"], bearer, f"org/{s['model']}",
                                        mode="hang" if s["mode"] == "hang" else "ok")
        instances.setdefault(s["box"], {})[s["port"]] = port
    vast = FakeVast([vast_instance(i, ip, ports) for i, (ip, ports) in enumerate(instances.items())])
    litellm = FakeLitellmHttp()
    async with serve(vast.app()) as (vast_port,), serve(litellm.app()) as (litellm_port,):
        print(json.dumps({"vast": vast_port, "litellm": litellm_port, "key": litellm.master_key}), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the parent closes stdin
    await runner.cleanup()


def build_fleet(servers: list[dict[str, Any]], probe_concurrency: int, timeout: float) -> Fleet:
    recipes = {m: Recipe(m, VllmRecipe(model=f"org/{m}", served_model_name=m)) for m in MODELS}
    rows: dict[str, list[ServerRow]] = {}
    for s in servers:
        rows.setdefault(s["box"], []).append(ServerRow(s["model"], s["port"], s["model"] + f"-{s['port']}"))
    boxes = {ip: Box(ip, tuple(r), provider=Provider.VAST) for ip, r in rows.items()}
    settings = FleetSettings(reconcile=ReconcileSettings(probe_timeout_s=timeout, probe_concurrency=probe_concurrency,
                                                         max_deletes_per_pass=10_000, max_delete_fraction=1.0))
    return Fleet("b" * 40, settings, frozen_map(recipes), frozen_map(boxes))


def raise_open_files_limit() -> int:
    """One listening socket per fake server: 30,000 at 10,000 boxes. Root may raise the hard limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    for wanted in (max(hard, 1 << 17), hard):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, wanted))
            return wanted
        except (ValueError, OSError):
            continue
    return soft


async def run(args: argparse.Namespace) -> dict[str, Any]:
    raise_open_files_limit()  # inherited by the fakes' process
    servers = plan_servers(args.boxes)
    root = str(Path(__file__).resolve().parents[1])
    fakes = subprocess.Popen([sys.executable, __file__, "--serve-fakes"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": root})
    assert fakes.stdin is not None
    assert fakes.stdout is not None
    fakes.stdin.write(json.dumps({"servers": servers}) + "\n")
    fakes.stdin.flush()
    ready = json.loads(fakes.stdout.readline())
    store = open_store(getattr(args, "state", None))
    try:
        fleet = build_fleet(servers, args.probe_concurrency, args.probe_timeout)
        access = ProviderAccess("vast-test-key", f"http://127.0.0.1:{ready['vast']}", 30, RetryPolicy(attempts=3))
        observer = Observer({Provider.VAST: VastClient(access)}, args.probe_timeout, args.probe_concurrency)
        reconciler = Reconciler(Bearers(Salt(SALT)), observer,
                                lambda session: LitellmClient(session, f"http://127.0.0.1:{ready['litellm']}",
                                                              ready["key"]),
                                store, write_concurrency=args.write_concurrency)
        results = {}
        for name in ("first pass (creates)", "steady pass"):
            cpu0, t0 = time.process_time(), time.perf_counter()
            outcome = await reconciler.run_pass(fleet, apply=True)
            wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
            results[name] = {"wall_s": round(wall, 2), "reconciler_cpu_s": round(cpu, 2),
                             **outcome.observation.durations, "verdicts": dict(outcome.record.verdicts),
                             "actions": len(outcome.results), "failed": sum(1 for r in outcome.results if not r.ok)}
        return {"boxes": args.boxes, "servers": len(servers), "probe_concurrency": args.probe_concurrency,
                "probe_timeout_s": args.probe_timeout, "passes": results, "load": os.getloadavg()}
    finally:
        if isinstance(store, SqlStateStore):
            store.close()
        fakes.stdin.close()
        fakes.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--boxes", type=int, default=1000)
    parser.add_argument("--probe-concurrency", type=int, default=256)
    parser.add_argument("--probe-timeout", type=float, default=3.0)
    parser.add_argument("--write-concurrency", type=int, default=8)
    parser.add_argument("--state", metavar="URL", help="the reconciler's state store (default: in memory)")
    parser.add_argument("--serve-fakes", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_fakes:
        asyncio.run(serve_fakes(json.loads(sys.stdin.readline())))
        return
    print(json.dumps(asyncio.run(run(args)), indent=2))


if __name__ == "__main__":
    main()
