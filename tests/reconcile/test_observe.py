"""Adapters against local HTTP fakes: probes (every outcome), Vast paging and 429s, RunPod's late
ports, and the observer putting it together with bounded concurrency."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from typing import TypeVar

import aiohttp

from fleetllm.adapters.http import RetryPolicy
from fleetllm.adapters.probe import probe
from fleetllm.adapters.providers import ProviderAccess, RunPodClient, VastClient
from fleetllm.core.fleet.model import Provider
from fleetllm.core.judge.intended import Endpoint
from fleetllm.core.judge.observed import ProbeStatus
from fleetllm.core.secret import Secret
from fleetllm.job.observer import Observer

from .builders import intended, server
from .fake_litellm import FakeLitellm
from .fakes import FakeRunPod, FakeServer, FakeVast, FakeVllm, free_port, runpod_pod, serve, vast_instance

T = TypeVar("T")
FAST_RETRY = RetryPolicy(attempts=4, base_delay_s=0.01)


def run(make: Callable[[], Awaitable[T]]) -> T:
    return asyncio.run(make())  # type: ignore[arg-type]


async def probe_one(fake: FakeServer, bearer: str, name: str, timeout: float = 2.0) -> ProbeStatus:
    vllm = FakeVllm()
    async with serve(vllm.app()) as (port,), aiohttp.ClientSession() as session:
        vllm.servers[port] = fake
        result = await probe(session, Endpoint("127.0.0.1", port), bearer, name, timeout)
        return result.status


def test_probe_outcomes() -> None:
    good = FakeServer("qwen", "sk-vllm-right")
    assert run(lambda: probe_one(good, "sk-vllm-right", "qwen")) is ProbeStatus.OK
    assert run(lambda: probe_one(good, "sk-vllm-wrong", "qwen")) is ProbeStatus.UNAUTHORIZED
    assert run(lambda: probe_one(good, "sk-vllm-right", "llama")) is ProbeStatus.WRONG_MODEL
    bad = dataclasses.replace(good, mode="not-json")
    assert run(lambda: probe_one(bad, "sk-vllm-right", "qwen")) is ProbeStatus.BAD_REPLY
    dead = dataclasses.replace(good, mode="unhealthy")
    assert run(lambda: probe_one(dead, "sk-vllm-right", "qwen")) is ProbeStatus.UNHEALTHY
    hung = dataclasses.replace(good, mode="hang")
    assert run(lambda: probe_one(hung, "sk-vllm-right", "qwen", timeout=0.3)) is ProbeStatus.TIMEOUT


def test_probe_refused_while_loading_and_dns_failure_is_ours() -> None:
    async def go() -> tuple[ProbeStatus, ProbeStatus]:
        async with aiohttp.ClientSession() as session:
            refused = await probe(session, Endpoint("127.0.0.1", free_port()), "k", "m", 2)
            dns = await probe(session, Endpoint("no-such-box.invalid", 8001), "k", "m", 2)
            return refused.status, dns.status

    refused, dns = run(go)
    assert refused is ProbeStatus.REFUSED
    assert dns is ProbeStatus.ERROR


def test_probe_reads_max_model_len_and_root() -> None:
    async def go() -> tuple[int | None, str | None]:
        vllm = FakeVllm()
        async with serve(vllm.app()) as (port,), aiohttp.ClientSession() as session:
            vllm.servers[port] = FakeServer("qwen", "k", root="Qwen/Qwen3-8B-FP8", max_model_len=40960)
            result = await probe(session, Endpoint("127.0.0.1", port), "k", "qwen", 2)
            return result.max_model_len, result.root

    assert run(go) == (40960, "Qwen/Qwen3-8B-FP8")


def test_vast_pages_retries_429_and_reads_ports() -> None:
    instances = [vast_instance(i, f"192.0.2.{i}", {8001: 40000 + i, 8002: 41000 + i}) for i in range(1, 61)]
    instances.append(vast_instance(100, "192.0.2.100", None, status="loading"))  # no ports while loading
    instances.append(vast_instance(101, "192.0.2.101", {8001: 1}, status="running"))
    instances.append(vast_instance(102, "192.0.2.101", {8001: 2}, status="running"))  # shared IP, no label
    instances.append(vast_instance(103, "192.0.2.103", {8001: 3}, status="exited"))
    instances.append(vast_instance(104, "192.0.2.103", {8001: 4}, status="running", label="192.0.2.103"))
    fake = FakeVast(instances, throttle=2)

    async def go():  # type: ignore[no-untyped-def]
        async with serve(fake.app()) as (port,), aiohttp.ClientSession() as session:
            client = VastClient(ProviderAccess(Secret(fake.api_key, "test"), f"http://127.0.0.1:{port}", 5, FAST_RETRY))
            return await client.list(session)

    listing = run(go)
    assert listing.ok, listing.error
    assert fake.calls == 2 + 3  # two 429s, then 65 instances in pages of 25
    assert len(listing.boxes) == 63
    assert listing.boxes["192.0.2.7"].endpoints[8001] == Endpoint("192.0.2.7", 40007)
    assert listing.boxes["192.0.2.7"].endpoints[8002] == Endpoint("192.0.2.7", 41007)
    assert listing.boxes["192.0.2.100"].endpoints == {}
    assert listing.boxes["192.0.2.100"].status == "loading"
    assert "share the IP" in (listing.boxes["192.0.2.101"].ambiguous or "")
    assert listing.boxes["192.0.2.103"].endpoints[8001] == Endpoint("192.0.2.103", 4)


def test_vast_failures_are_failed_listings() -> None:
    fake = FakeVast([vast_instance(1, "192.0.2.1", {8001: 1})], throttle=100)

    async def go(key: str):  # type: ignore[no-untyped-def]
        async with serve(fake.app()) as (port,), aiohttp.ClientSession() as session:
            client = VastClient(ProviderAccess(Secret(key, "test"), f"http://127.0.0.1:{port}", 5, FAST_RETRY))
            return await client.list(session)

    throttled = run(lambda: go(fake.api_key))
    assert not throttled.ok
    assert "429" in (throttled.error or "")
    denied = run(lambda: go("wrong-key"))
    assert "401" in (denied.error or "")
    assert "wrong-key" not in (denied.error or "")


def test_runpod_late_ports_and_429() -> None:
    fake = FakeRunPod([runpod_pod("k7v2m9x4q1w8e3", {8001: 41010}, ip="203.0.113.7"),
                       runpod_pod("starting01", None, status="STARTING")], throttle=1)

    async def go():  # type: ignore[no-untyped-def]
        async with serve(fake.app()) as (port,), aiohttp.ClientSession() as session:
            client = RunPodClient(ProviderAccess(Secret(fake.api_key, "test"), f"http://127.0.0.1:{port}", 5, FAST_RETRY))
            return await client.list(session)

    listing = run(go)
    assert listing.ok, listing.error
    assert listing.boxes["k7v2m9x4q1w8e3"].endpoints[8001] == Endpoint("203.0.113.7", 41010)
    assert listing.boxes["starting01"].endpoints == {}
    assert listing.boxes["starting01"].status == "starting"


def test_observer_probes_every_server_through_provider_ports() -> None:
    """Vast maps listen ports to public ports on 127.0.0.1; the observer dials the public ones."""
    vllm = FakeVllm()
    a = server("127.0.0.1", 8001, "qwen", provider=Provider.VAST)
    b = server("127.0.0.1", 8002, "llama", provider=Provider.VAST)
    c = server("127.0.0.9", 8001, "gone", provider=Provider.VAST)  # not listed: Missing

    async def go():  # type: ignore[no-untyped-def]
        async with serve(vllm.app(), [0, 0]) as ports, aiohttp.ClientSession() as session:
            vllm.servers[ports[0]] = FakeServer("qwen", a.bearer, "org/qwen")
            vllm.servers[ports[1]] = FakeServer("other", b.bearer)
            vast = FakeVast([vast_instance(1, "127.0.0.1", {8001: ports[0], 8002: ports[1]})])
            async with serve(vast.app()) as (vport,):
                observer = Observer({Provider.VAST: VastClient(ProviderAccess(Secret(vast.api_key, "test"), f"http://127.0.0.1:{vport}",
                                                                              5, FAST_RETRY))},
                                    probe_timeout_s=2, probe_concurrency=2)
                return await observer.observe(session, intended([a, b, c]), FakeLitellm(), {})

    obs = run(go)
    assert obs.probes[a.key].status is ProbeStatus.OK
    assert obs.probes[b.key].status is ProbeStatus.WRONG_MODEL
    assert c.key not in obs.probes
    assert not obs.resolutions[c.key].listed
    assert obs.deployments == ()


def test_litellm_errors_never_carry_a_bearer_or_the_master_key() -> None:
    """FastAPI's 422 echoes its input; a proxy may echo the Authorization header."""
    from aiohttp import web

    from fleetllm.adapters.litellm import LitellmClient, LitellmError
    from fleetllm.core.judge.intended import desired_deployment

    async def echo(request: web.Request) -> web.Response:
        body = await request.json()
        return web.json_response({"detail": [{"loc": ["body"], "msg": "bad", "input": body,
                                              "auth": request.headers.get("Authorization")}]}, status=422)

    app = web.Application()
    app.router.add_post("/model/new", echo)
    s = server("127.0.0.2", 8001, "qwen")
    spec = desired_deployment(s, Endpoint("127.0.0.2", 8001), "a" * 40)

    async def go() -> str:
        async with serve(app) as (port,), aiohttp.ClientSession() as session:
            client = LitellmClient(session, f"http://127.0.0.1:{port}", Secret("sk-master-secret-value", "test"))
            try:
                await client.create(spec)
            except LitellmError as exc:
                return str(exc)
            raise AssertionError("a 422 must fail")

    message = run(go)
    assert "422" in message
    assert s.bearer not in message
    assert "sk-master-secret-value" not in message
