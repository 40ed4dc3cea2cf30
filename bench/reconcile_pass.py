"""One reconcile pass over a synthetic fleet against local fakes (issue 5's scale figure).

N boxes (Vast, one loopback address each: 127.1.x.y), 3 servers per box, 5% of the servers hang
(probe timeouts), 5% answer with another bearer (Foreign). The fakes (a multi-port vLLM stand-in, Vast's
paged listing, LiteLLM's model API over HTTP) run in separate processes (the vLLM stand-ins in shards of
SHARD sockets); the reconciler runs here.
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

from fleetllm.adapters.http import RetryPolicy
from fleetllm.adapters.litellm import LitellmClient
from fleetllm.adapters.providers import ProviderAccess, VastClient
from fleetllm.adapters.state import open_reconcile_state
from fleetllm.adapters.state.sqlstore import SqlStateStore
from fleetllm.core.fleet.bearer import Salt
from fleetllm.core.fleet.model import (
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
from fleetllm.core.fleet.render import Bearers
from fleetllm.core.secret import Secret
from fleetllm.job.engine import Reconciler
from fleetllm.job.observer import Observer

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


SHARD = 9_000  # fake vLLM servers (listening sockets) per process: the open-files limit here is 20,000


async def serve_vllm(spec: dict[str, Any]) -> None:
    """One shard of the fake vLLM servers, one listening socket each; prints where each listens."""
    from aiohttp import web

    from tests.reconcile.fakes import FakeServer, FakeVllm

    salt = Salt(SALT)
    vllm = FakeVllm()
    runner = web.AppRunner(vllm.app(), access_log=None, handler_cancellation=True)
    await runner.setup()
    where: dict[str, dict[int, int]] = {}
    for s in spec["servers"]:
        site = web.TCPSite(runner, s["box"], 0, backlog=256)
        await site.start()
        sockets = site._server.sockets if site._server is not None else ()  # type: ignore[union-attr]
        if not sockets:
            raise SystemExit(f"cannot listen on {s['box']}: no socket was bound")
        port = int(sockets[0].getsockname()[1])
        bearer = salt.derive(s["box"], s["port"]) if s["mode"] != "foreign" else "sk-vllm-someone-else"
        vllm.servers[(s["box"], port)] = FakeServer(s["model"], bearer, f"org/{s['model']}",
                                        mode="hang" if s["mode"] == "hang" else "ok")
        where.setdefault(s["box"], {})[s["port"]] = port
    print(json.dumps({"instances": where}), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the parent closes stdin
    await runner.cleanup()


async def serve_apis(spec: dict[str, Any]) -> None:
    """Vast's listing (every box with its port map) and LiteLLM's model API."""
    from tests.reconcile.fakes import FakeLitellmHttp, FakeVast, serve, vast_instance

    instances = {box: {int(k): v for k, v in ports.items()} for box, ports in spec["instances"].items()}
    vast = FakeVast([vast_instance(i, ip, ports) for i, (ip, ports) in enumerate(instances.items())])
    litellm = FakeLitellmHttp()
    async with serve(vast.app()) as (vast_port,), serve(litellm.app()) as (litellm_port,):
        print(json.dumps({"vast": vast_port, "litellm": litellm_port, "key": litellm.master_key}), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)


def start_fakes(role: str, spec: dict[str, Any]) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    root = str(Path(__file__).resolve().parents[1])
    process = subprocess.Popen([sys.executable, __file__, f"--serve-{role}"], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": root})
    assert process.stdin is not None
    assert process.stdout is not None
    process.stdin.write(json.dumps(spec) + "\n")
    process.stdin.flush()
    line = process.stdout.readline()
    if not line:
        process.wait(timeout=30)
        raise SystemExit(f"the {role} fakes did not start (exit {process.returncode})")
    ready: dict[str, Any] = json.loads(line)
    return process, ready


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
    raise_open_files_limit()  # inherited by the fakes' processes
    servers = plan_servers(args.boxes)
    fakes: list[subprocess.Popen[str]] = []
    store = None
    try:
        instances: dict[str, dict[str, int]] = {}
        for first in range(0, len(servers), SHARD):
            process, shard = start_fakes("vllm", {"servers": servers[first:first + SHARD]})
            fakes.append(process)
            instances.update(shard["instances"])
        process, ready = start_fakes("apis", {"instances": instances})
        fakes.append(process)
        store = open_reconcile_state(getattr(args, "state", None))
        fleet = build_fleet(servers, args.probe_concurrency, args.probe_timeout)
        access = ProviderAccess(Secret("vast-test-key", "bench"), f"http://127.0.0.1:{ready['vast']}", 30,
                                RetryPolicy(attempts=3))
        observer = Observer({Provider.VAST: VastClient(access)}, args.probe_timeout, args.probe_concurrency)
        reconciler = Reconciler(Bearers(Salt(SALT)), observer,
                                lambda session: LitellmClient(session, f"http://127.0.0.1:{ready['litellm']}",
                                                              Secret(ready["key"], "bench")),
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
        for process in fakes:
            if process.stdin is not None:
                process.stdin.close()
            process.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--boxes", type=int, default=1000)
    parser.add_argument("--probe-concurrency", type=int, default=256)
    parser.add_argument("--probe-timeout", type=float, default=3.0)
    parser.add_argument("--write-concurrency", type=int, default=8)
    parser.add_argument("--state", metavar="URL", help="the reconciler's state store (default: in memory)")
    parser.add_argument("--serve-vllm", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--serve-apis", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_vllm or args.serve_apis:
        asyncio.run((serve_vllm if args.serve_vllm else serve_apis)(json.loads(sys.stdin.readline())))
        return
    print(json.dumps(asyncio.run(run(args)), indent=2))


if __name__ == "__main__":
    main()
