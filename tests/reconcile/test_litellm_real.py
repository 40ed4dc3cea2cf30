"""The LiteLLM client against the real proxy: create with our id, duplicate create re-checked by id,
PATCH keeps the id, paging, delete of a missing id, unmanaged rows never written by apply."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from typing import TypeVar

import aiohttp
import pytest

from fleetllm.adapters.litellm import LitellmClient, LitellmError
from fleetllm.core.judge.intended import Endpoint, desired_deployment
from fleetllm.core.judge.plan import Action, ActionKind, Plan
from fleetllm.core.secret import Secret
from fleetllm.job.apply import apply_plan
from tests.support.litellm import LitellmProxy

from .builders import server

T = TypeVar("T")
S1, S2 = server("127.0.0.2", 8001, "qwen"), server("127.0.0.2", 8002, "llama")


def with_client(proxy: LitellmProxy, body: Callable[[LitellmClient], Awaitable[T]], page_size: int = 500) -> T:
    async def go() -> T:
        async with aiohttp.ClientSession() as session:
            return await body(LitellmClient(session, proxy.url, Secret(proxy.master_key, "test"), page_size=page_size))
    return asyncio.run(go())


def test_create_get_update_delete(litellm: LitellmProxy) -> None:
    spec = desired_deployment(S1, Endpoint("127.0.0.2", 8001), "a" * 40)
    moved = desired_deployment(S1, Endpoint("127.0.0.2", 41877), "b" * 40)

    async def body(client: LitellmClient) -> None:
        await client.create(spec)
        await client.create(spec)  # LiteLLM answers 500 for the duplicate id: re-checked, same spec, done
        got = await client.get(spec.id)
        assert got is not None
        assert got.managed
        assert got.spec == spec.spec
        assert got.api_base == "http://127.0.0.2:8001/v1"
        await client.update(moved)
        got = await client.get(spec.id)
        assert got is not None
        assert got.id == spec.id  # PATCH with model_info.id keeps the id
        assert got.spec == moved.spec
        assert got.recorded_api_base == "http://127.0.0.2:41877/v1"
        other = desired_deployment(S1, Endpoint("127.0.0.2", 9999), "c" * 40)
        with pytest.raises(LitellmError, match="500"):
            await client.create(other)  # same id, different spec: a real conflict
        assert await client.delete(spec.id) is True
        assert await client.delete(spec.id) is False  # 400 not found: already gone
        assert await client.get(spec.id) is None

    with_client(litellm, body)
    raw = str(litellm.deployments())
    assert S1.bearer not in raw  # api_key is never listed


def test_listing_pages_through_everything(litellm: LitellmProxy) -> None:
    servers = [server("127.0.0.3", 8000 + i, f"m{i}") for i in range(1, 8)]

    async def body(client: LitellmClient) -> int:
        for s in servers:
            await client.create(desired_deployment(s, Endpoint(s.box, s.port), "a" * 40))
        return len([d for d in await client.list_deployments() if d.id.startswith("fleetllm:127.0.0.3:")])

    assert with_client(litellm, body, page_size=3) == 7


def test_apply_never_writes_an_unmanaged_row_with_our_id(litellm: LitellmProxy) -> None:
    status, _ = litellm.call("POST", "/model/new", {
        "model_name": "qwen", "litellm_params": {"model": "hosted_vllm/qwen", "api_base": "http://127.0.0.2:8002/v1",
                                                 "api_key": "sk-hand-made"},
        "model_info": {"id": S2.id}})
    assert status == 200
    spec = desired_deployment(S2, Endpoint(S2.box, S2.port), "a" * 40)
    plan = Plan("a" * 40, 0.0, (Action(ActionKind.CREATE, S2.id, "llama", "test", after=spec),
                                Action(ActionKind.DELETE, S2.id, "llama", "test")))

    async def body(client: LitellmClient):  # type: ignore[no-untyped-def]
        return await apply_plan(plan, client)

    results = with_client(litellm, body)
    assert [r.outcome for r in results] == ["refused", "refused"]
    row = next(r for r in litellm.deployments() if r["model_info"]["id"] == S2.id)
    assert row["model_name"] == "qwen"
    assert "managed_by" not in row["model_info"]


def test_replace_drops_a_removed_param(litellm: LitellmProxy) -> None:
    with_param = dataclasses.replace(S1, route=dataclasses.replace(
        S1.route, params={"chat_template_kwargs": {"enable_thinking": False}}))
    old = desired_deployment(with_param, Endpoint(S1.box, S1.port), "a" * 40)
    new = desired_deployment(S1, Endpoint(S1.box, S1.port), "b" * 40)

    async def body(client: LitellmClient):  # type: ignore[no-untyped-def]
        await client.create(old)
        before = await client.get(old.id)
        return await apply_plan(Plan("b" * 40, 0.0, (Action(ActionKind.REPLACE, old.id, "qwen", "param removed",
                                                            after=new, before=before),)), client)

    results = with_client(litellm, body)
    assert [r.outcome for r in results] == ["replaced"]
    row = next(r for r in litellm.deployments() if r["model_info"]["id"] == S1.id)
    assert "chat_template_kwargs" not in row["litellm_params"]
