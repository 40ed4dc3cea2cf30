"""LiteLLM deployment creates per second against the real proxy, at a given write concurrency, the
way `apply` does them (re-check by id, then POST /model/new), then the deletes.

    source .ci-cache/litellm/env.sh ... (a running proxy), then
    FLEETLLM_TEST_LITELLM_URL=http://127.0.0.1:PORT FLEETLLM_TEST_LITELLM_MASTER_KEY=sk-... \\
        .venv/bin/python bench/reconcile_litellm_writes.py --count 3000 --concurrency 8
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fleetllm.adapters.litellm import LitellmClient
from fleetllm.core.fleet.bearer import Salt
from fleetllm.core.fleet.model import LitellmRoute, Provider
from fleetllm.core.judge.intended import Endpoint, IntendedServer, desired_deployment
from fleetllm.core.judge.plan import Action, ActionKind, Plan
from fleetllm.core.secret import Secret
from fleetllm.job.apply import apply_plan

SALT = Salt("bench-salt-0123456789abcdef")


def servers(count: int) -> list[IntendedServer]:
    out = []
    for n in range(count):
        box, port = f"127.2.{n // 750}.{(n // 3) % 250 + 1}", 8001 + n % 3
        out.append(IntendedServer(box=box, port=port, name=f"m{n % 10}", model=f"bench-m{n % 10}",
                                  served_model_name=f"bench-m{n % 10}", weights="org/m", max_model_len=4096,
                                  digest="sha256:x", bearer=SALT.derive(box, port), provider=Provider.STATIC,
                                  route=LitellmRoute()))
    return out


async def run(url: str, key: str, count: int, concurrency: int) -> dict[str, object]:
    specs = [desired_deployment(s, Endpoint(s.box, s.port), "c" * 40) for s in servers(count)]
    creates = Plan("c" * 40, 0, tuple(Action(ActionKind.CREATE, s.id, s.model_name, "bench", after=s) for s in specs))
    deletes = Plan("c" * 40, 0, tuple(Action(ActionKind.DELETE, s.id, s.model_name, "bench") for s in specs))
    connector = aiohttp.TCPConnector(limit=concurrency + 4)
    async with aiohttp.ClientSession(connector=connector) as session:
        client = LitellmClient(session, url, Secret(key, "bench"), timeout_s=120)
        t0 = time.perf_counter()
        created = await apply_plan(creates, client, concurrency)
        t_create = time.perf_counter() - t0
        t0 = time.perf_counter()
        listed = len(await client.list_deployments())
        t_list = time.perf_counter() - t0
        t0 = time.perf_counter()
        deleted = await apply_plan(deletes, client, concurrency)
        t_delete = time.perf_counter() - t0
    return {"count": count, "concurrency": concurrency,
            "create_s": round(t_create, 1), "creates_per_s": round(count / t_create, 1),
            "create_failures": sum(1 for r in created if not r.ok),
            "list_all_s": round(t_list, 2), "listed": listed,
            "delete_s": round(t_delete, 1), "deletes_per_s": round(count / t_delete, 1),
            "delete_failures": sum(1 for r in deleted if not r.ok), "load_after": os.getloadavg()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    url, key = os.environ.get("FLEETLLM_TEST_LITELLM_URL"), os.environ.get("FLEETLLM_TEST_LITELLM_MASTER_KEY")
    if not url or not key:
        sys.exit("set FLEETLLM_TEST_LITELLM_URL and FLEETLLM_TEST_LITELLM_MASTER_KEY to a running proxy")
    print(json.dumps({"load_before": os.getloadavg(), **asyncio.run(run(url, key, args.count, args.concurrency))}))


if __name__ == "__main__":
    main()
