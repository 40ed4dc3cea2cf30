"""A fleet with a server in each state, built with real parts: a fleet git repository; the control
plane (its box endpoints record fetches, reports and an unknown box); vLLM servers on loopback
addresses (tests/reconcile/fakes.FakeVllm, vLLM's wire format); and reconcile passes run by the real
Reconciler into the control plane's SQLite state file, against LiteLLM's model API in memory
(tests/reconcile/fake_litellm.FakeLitellm) seeded with two deployments fleetllm does not manage.

    127.0.0.2  tiny-a  Healthy (deployment created)    tiny-b  Stale (serves max_model_len 2048)
    127.0.0.3  slow-c  Stalled (fetched, grace 0, nothing answers; its report says it does not fit)
    127.0.0.4  tiny-a  Foreign (answers, but not with our bearer)
    127.0.0.5  tiny-b  Pending (never fetched)
    198.51.100.77      an unknown box presenting the fleet key
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetllm.adapters.state import open_reconcile_state
from fleetllm.core.fleet.bearer import Salt
from fleetllm.core.fleet.jsonvalue import freeze_mapping
from fleetllm.core.fleet.model import Fleet
from fleetllm.core.fleet.render import Bearers
from fleetllm.core.judge.observed import Deployment
from fleetllm.job.engine import PassOutcome, Reconciler
from fleetllm.job.observer import Observer
from tests.conftest import TEST_LEGACY_KEY, TEST_SALT, git
from tests.reconcile.fake_litellm import FakeLitellm
from tests.reconcile.fakes import FakeServer, FakeVllm, serve
from tests.support.ports import free_ports

HEALTHY_BOX, STALLED_BOX, FOREIGN_BOX, PENDING_BOX = "127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"
UNKNOWN_BOX = "198.51.100.77"
MANUAL_ID, OTHER_ID = "manual-tiny-a", "someone-elses-model"
FIT_PROBLEM = "slow-c needs 90 GB of GPU memory, the box has 80 GB"
BAD_MODEL_ERROR = "unknown model 'no-such-model'"


def write_fleet(repo: Path, port: int, port2: int) -> None:
    (repo / "fleet.yaml").write_text(
        "version: 1\nfleet_id: test-fleet\n"
        f"listen_ports: [{port}, {port2}]\n"
        "reconcile:\n  interval_s: 60\n  health_grace_s: 600\n  probe_timeout_s: 2\n  down_after_failures: 2\n"
        "  up_after_successes: 1\n  max_deletes_per_pass: 10\n  max_delete_fraction: 1.0\n")
    (repo / "models.yaml").write_text(
        "models:\n"
        "  tiny-a:\n    vllm: {model: org/tiny-a, max_model_len: 4096, vram_gb: 2, disk_gb: 1}\n"
        "  tiny-b:\n    vllm: {model: org/tiny-b, max_model_len: 4096, vram_gb: 2, disk_gb: 1}\n"
        "  slow-c:\n    health_grace_s: 0\n    vllm: {model: org/slow-c, max_model_len: 8192, vram_gb: 90, disk_gb: 1}\n")
    rows = {HEALTHY_BOX: [("tiny-a", port), ("tiny-b", port2)], STALLED_BOX: [("slow-c", port)],
            FOREIGN_BOX: [("tiny-a", port)], PENDING_BOX: [("tiny-b", port)]}
    lines = ["# Where each model runs.", "hosts:"]
    for box, servers in rows.items():
        lines += [f"  {box}:", "    provider: static", "    servers:"]
        lines.extend(f"      - [{model}, {p}]" for model, p in servers)
    (repo / "placement.yaml").write_text("\n".join(lines) + "\n")


def make_repo(repo: Path) -> tuple[int, int]:
    repo.mkdir(parents=True)
    first, second = free_ports("127.0.0.1", "127.0.0.1")
    ports = (first, second)
    git(repo, "init", "-q", "-b", "main")
    write_fleet(repo, *ports)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "fleet of four boxes")
    return ports


def break_branch(repo: Path) -> str:
    """A commit on main the control plane must not serve."""
    with (repo / "placement.yaml").open("a") as fh:
        fh.write("  203.0.113.98:\n    servers:\n      - [no-such-model, 8001]\n")
    git(repo, "commit", "-qam", "place a model that does not exist")
    return git(repo, "rev-parse", "HEAD")


def seeded_litellm(port: int) -> FakeLitellm:
    """LiteLLM with a hand-made deployment at the healthy server's address (drift, and a duplicate once
    fleetllm creates its own) and one elsewhere."""
    def unmanaged(ident: str, model: str, api_base: str) -> Deployment:
        return Deployment(ident, model, freeze_mapping({"id": ident}), api_base)

    return FakeLitellm(rows={
        MANUAL_ID: unmanaged(MANUAL_ID, "tiny-a", f"http://{HEALTHY_BOX}:{port}/v1"),
        OTHER_ID: unmanaged(OTHER_ID, "gpt-elsewhere", "http://198.51.100.1:9000/v1")})


def report_body(config: dict[str, Any], *, fits: bool = True) -> dict[str, Any]:
    """What the installer reports after applying `config` (the box JSON it fetched)."""
    servers = [{"name": s["name"], "port": s["port"], "digest": s["digest"], "unit": f"vllm-{s['name']}",
                "state": "started" if fits else "written"} for s in config["servers"]]
    fit: dict[str, Any] = {"ok": True} if fits else {"ok": False, "problems": [FIT_PROBLEM]}
    return {"revision": config["revision"], "installer_version": "0.1.0",
            "outcome": "installed" if fits else "fit_failed", "fit": fit, "servers": servers}


@dataclass
class Stubs:
    """The vLLM servers of the scenario, up while passes run."""

    ports: tuple[int, int]
    salt: Salt = field(default_factory=lambda: Salt(TEST_SALT))

    def vllm(self) -> FakeVllm:
        port, port2 = self.ports
        return FakeVllm({
            (HEALTHY_BOX, port): FakeServer("tiny-a", self.salt.derive(HEALTHY_BOX, port), "org/tiny-a", 4096),
            (HEALTHY_BOX, port2): FakeServer("tiny-b", self.salt.derive(HEALTHY_BOX, port2), "org/tiny-b", 2048),
            (FOREIGN_BOX, port): FakeServer("tiny-a", "sk-vllm-somebody-elses", "org/tiny-a", 4096)})

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        port, port2 = self.ports
        app = self.vllm().app()
        async with contextlib.AsyncExitStack() as stack:
            await stack.enter_async_context(serve(app, (port, port2), HEALTHY_BOX))
            await stack.enter_async_context(serve(app, (port,), FOREIGN_BOX))
            yield


def run_passes(state: Path, fleet: Fleet, litellm: FakeLitellm, stubs: Stubs, clock: Callable[[], float],
               count: int = 2, *, apply: bool = True, suspended: bool = False) -> list[PassOutcome]:
    """`count` passes by the real Reconciler, recorded in the state file; planned only (as with
    `reconcile.dry_run`) when not `apply`; `suspended`: as the reconcile job runs them while the fleet is
    suspended."""
    async def passes() -> list[PassOutcome]:
        store = open_reconcile_state(str(state))
        try:
            reconciler = Reconciler(Bearers(stubs.salt, TEST_LEGACY_KEY), Observer({}, 2.0, 16, clock=clock),
                                    lambda _session: litellm, store, clock=clock)
            async with stubs.running():
                return [await reconciler.run_pass(fleet, apply=apply, record=True, suspended=suspended)
                        for _ in range(count)]
        finally:
            store.close()

    with ThreadPoolExecutor(1) as pool:  # its own thread: the caller may be inside an event loop (Playwright's)
        return pool.submit(asyncio.run, passes()).result()
