"""Boot storm: 1,000 boxes fetching from the real control plane within about a second.

    .venv/bin/python bench/boot_storm.py [--boxes 1000] [--wrong-keys 100] [--made-up 100] [--spread 1.0]

Builds bench/fleetgen's repository of `--boxes` boxes (3 servers each) in a temp git repo, starts
`fleetllm serve` on a free loopback port (one gthread worker, as shipped) and lets every box boot at a
random instant within `--spread` seconds, each on its own connection as separate machines would:
GET /vllm/installer, then GET /vllm/config. Mixed in at random instants: `--wrong-keys` requests with a
wrong fleet key (for real boxes) and `--made-up` requests with the right key from host names that are
not in the placement (they land on the attention list, capped at `--attention-cap`).

Prints one JSON object: answers by kind and status, latency percentiles, the attention list's size,
and the server's memory (resident before and after, peak = VmHWM of the server and its worker).
tests/faults/test_boot_storm.py runs the same storm and asserts on it; docs/reliability.md quotes it.
Loopback only, one request (two for a booting box) per client, bounded by the client timeout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.fleetgen import box_name, write_fleet

FLEET_KEY = "storm-fleet-key-0123456789"
SALT = "storm-salt-0123456789abcdef"


@dataclass(frozen=True)
class Client:
    kind: str  # box | wrong-key | made-up
    host: str
    key: str
    at: float  # seconds after the storm starts


@dataclass
class Storm:
    answers: Counter[tuple[str, int]] = field(default_factory=Counter)  # (kind, status) of the config fetch
    wrong_bodies: list[str] = field(default_factory=list)  # a box given another box's JSON, or no JSON
    errors: Counter[str] = field(default_factory=Counter)  # transport failures, by exception
    latencies_ms: list[float] = field(default_factory=list)  # of every config fetch that got an answer
    installer_ok: int = 0
    last_start_s: float = 0.0
    duration_s: float = 0.0

    def summary(self) -> dict[str, Any]:
        lat = sorted(self.latencies_ms)

        def pct(p: float) -> float:
            return round(lat[min(len(lat) - 1, int(p * len(lat)))], 1) if lat else 0.0

        return {"answers": {f"{k} {s}": n for (k, s), n in sorted(self.answers.items())},
                "wrong_bodies": len(self.wrong_bodies), "transport_errors": dict(self.errors),
                "installer_downloads": self.installer_ok,
                "requests_answered": sum(self.answers.values()) + self.installer_ok,
                "last_start_s": round(self.last_start_s, 3), "duration_s": round(self.duration_s, 2),
                "latency_ms": {"p50": pct(0.5), "p90": pct(0.9), "p99": pct(0.99), "max": pct(1.0),
                               "mean": round(statistics.fmean(lat), 1) if lat else 0.0}}


def clients(boxes: list[str], wrong_keys: int, made_up: int, spread_s: float, seed: int = 11) -> list[Client]:
    rng = random.Random(seed)
    out = [Client("box", b, FLEET_KEY, rng.uniform(0, spread_s)) for b in boxes]
    out += [Client("wrong-key", rng.choice(boxes), f"not-the-key-{i}", rng.uniform(0, spread_s))
            for i in range(wrong_keys)]
    out += [Client("made-up", f"made-up-{i}.example.invalid", FLEET_KEY, rng.uniform(0, spread_s))
            for i in range(made_up)]
    return sorted(out, key=lambda c: c.at)


def source_address(i: int) -> str:
    """A loopback source address of its own for client i, each in a /24 of its own (127.1.0.1,
    127.1.1.1, ..., 127.2.0.1 from the 251st on), as rented boxes mostly are: the control plane caps
    connections per peer address and per network (4 peers' worth in one IPv4 /24: server/guard.py), and
    a crowd of 250 from one /24 starting within a second would meet that cap, not the one it measures."""
    return f"127.{1 + i // 250}.{i % 250}.1"


async def _one(base: str, client: Client, started: float, storm: Storm, timeout_s: float, source: str) -> None:
    await asyncio.sleep(max(0.0, started + client.at - time.monotonic()))
    storm.last_start_s = max(storm.last_start_s, time.monotonic() - started)
    headers = {"Authorization": f"Bearer {client.key}", "X-LLMAO-Host": client.host}
    connector = aiohttp.TCPConnector(force_close=True, local_addr=(source, 0))  # a box of its own
    try:
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=timeout_s)) as s:
            if client.kind == "box":
                async with s.get(base + "/vllm/installer", headers=headers) as response:
                    await response.read()
                    storm.installer_ok += response.status == 200
            sent = time.perf_counter()
            async with s.get(base + "/vllm/config", headers=headers) as response:
                body = await response.read()
                storm.latencies_ms.append((time.perf_counter() - sent) * 1000)
                storm.answers[(client.kind, response.status)] += 1
                if client.kind == "box" and response.status == 200:
                    try:
                        ok = json.loads(body).get("host") == client.host
                    except ValueError:
                        ok = False
                    if not ok:
                        storm.wrong_bodies.append(client.host)
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        storm.errors[type(exc).__name__] += 1


async def run_storm(base: str, crowd: list[Client], timeout_s: float = 120.0) -> Storm:
    storm = Storm()
    started = time.monotonic()
    await asyncio.gather(*(_one(base, c, started, storm, timeout_s, source_address(i)) for i, c in enumerate(crowd)))
    storm.duration_s = time.monotonic() - started
    return storm


def raise_open_files(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(needed, soft)), hard))


def make_repo(directory: Path, boxes: int) -> Path:
    from tests.conftest import git

    repo = write_fleet(directory / "fleet", boxes)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "storm fleet")
    return repo


def main() -> None:
    from tests.support.plane import ControlPlane

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--boxes", type=int, default=1000)
    parser.add_argument("--wrong-keys", type=int, default=100)
    parser.add_argument("--made-up", type=int, default=100)
    parser.add_argument("--attention-cap", type=int, default=50)
    parser.add_argument("--spread", type=float, default=1.0, help="seconds over which the boxes start")
    args = parser.parse_args()
    raise_open_files(4 * (args.boxes + args.wrong_keys + args.made_up) + 256)
    with tempfile.TemporaryDirectory(prefix="boot-storm-") as tmp:
        directory = Path(tmp)
        repo = make_repo(directory, args.boxes)
        document = {"repo": {"path": str(repo), "branch": "main", "refresh_interval_s": 3600},
                    "secrets": {"fleet_key": "${env:FK}", "vllm_api_salt": "${env:SALT}"},
                    "state": {"url": f"sqlite:///{directory / 'state.sqlite3'}"},
                    "viewer_tokens": ["${env:VIEWER}"], "attention": {"max_entries": args.attention_cap}}
        viewer = "storm-viewer-token-0123"
        plane = ControlPlane(directory / "plane", document, {"FK": FLEET_KEY, "SALT": SALT, "VIEWER": viewer})
        try:
            plane.start(timeout_s=300)
            before = plane.memory()
            crowd = clients([box_name(i) for i in range(args.boxes)], args.wrong_keys, args.made_up, args.spread)
            storm = asyncio.run(run_storm(plane.url, crowd))
            after = plane.memory()
            _, attention = plane.json("/admin/attention", {"Authorization": f"Bearer {viewer}"})
            result = {"boxes": args.boxes, "wrong_keys": args.wrong_keys, "made_up": args.made_up,
                      "spread_s": args.spread, **storm.summary(),
                      "attention_entries": len(attention["entries"]), "attention_cap": attention["max_entries"],
                      "rss_before_mib": before.rss_mib, "rss_after_mib": after.rss_mib, "peak_mib": after.peak_mib,
                      "loadavg": " ".join(f"{x:.2f}" for x in os.getloadavg()), "cpus": os.cpu_count()}
            print(json.dumps(result, indent=2))
        finally:
            plane.stop()


if __name__ == "__main__":
    main()
