"""The provider fakes held to the providers' published API documents (tests/contracts/README.md says which
and where from): every answer the fakes in tests/reconcile/fakes.py serve, for every status they serve it
with, is fetched over HTTP and validated against the response schema the document gives for that path,
method, status and content type. The documents' own examples go through the reconciler's readers, so a
field the client reads under a wrong name fails here too. A wrong field name in production would leave
every box of that provider Unknown or Missing forever; these tests are where that would show first."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import aiohttp
import pytest

from fleetllm.adapters.http import RetryPolicy
from fleetllm.adapters.providers import (
    RUNPOD_URL,
    RUNPOD_V1_URL,
    ProviderAccess,
    RunPodClient,
    VastClient,
    runpod_boxes,
    runpod_v1_boxes,
    runpod_v1_url,
    vast_boxes,
)
from fleetllm.core.judge.intended import Endpoint
from fleetllm.core.secret import Secret
from tests.contracts.openapi import load, problems, response_schema
from tests.reconcile.fakes import FakeRunPod, FakeVast, runpod_pod, serve, vast_instance

RUNPOD_V1 = load("runpod-rest-v1.openapi.json")
RUNPOD_V2 = load("runpod-rest-v2.openapi.json")
VAST = load("vast.openapi.yaml")
T = TypeVar("T")
FAST = RetryPolicy(attempts=2, base_delay_s=0.01)


def validate(document: dict[str, Any], path: str, status: int, content_type: str, body: Any,
             method: str = "get") -> None:
    found = problems(response_schema(document, path, status, content_type, method), body)
    assert not found, "\n".join(found)


def run(make: Callable[[], Awaitable[T]]) -> T:
    return asyncio.run(make())  # type: ignore[arg-type]


async def fetch(url: str, key: str, params: dict[str, str] | None = None) -> tuple[int, str, Any]:
    async with aiohttp.ClientSession() as session, session.get(
            url, headers={"Authorization": f"Bearer {key}"}, params=params) as response:
        return response.status, response.content_type, json.loads(await response.read())


PODS = [runpod_pod("k7v2m9x4q1w8e3", {8001: 41010, 8002: 41011}, ip="203.0.113.7"),
        runpod_pod("starting01", None, status="STARTING"),
        runpod_pod("stopped001", None, status="EXITED")]


@pytest.mark.parametrize(("version", "path", "doc_path", "document"), [
    ("v2", "/v2/pods", "/v2/pods", RUNPOD_V2),
    ("v1", "/v1/pods", "/pods", RUNPOD_V1),
])
def test_every_runpod_answer_matches_the_published_schema(version: str, path: str, doc_path: str,
                                                          document: dict[str, Any]) -> None:
    fake = FakeRunPod(list(PODS), throttle=1)

    async def go() -> list[tuple[int, str, Any]]:
        async with serve(fake.app()) as (port,):
            base = f"http://127.0.0.1:{port}{path}"
            return [await fetch(base, fake.api_key), await fetch(base, fake.api_key), await fetch(base, "wrong")]

    answers = run(go)
    assert [status for status, _, _ in answers] == [429, 200, 401]
    for status, content_type, body in answers:
        if version == "v1" and status != 200:
            continue  # v1 documents no error bodies
        validate(document, doc_path, status, content_type, body)


def test_every_vast_page_matches_the_published_schema() -> None:
    instances = [vast_instance(i, f"192.0.2.{i}", {8001: 40000 + i}) for i in range(1, 30)]
    instances += [vast_instance(100, "192.0.2.100", None, status="loading"),
                  vast_instance(101, "192.0.2.101", {8001: 1}, label="192.0.2.101")]
    fake = FakeVast(instances, throttle=1)

    async def go() -> list[tuple[int, str, Any]]:
        async with serve(fake.app()) as (port,):
            url = f"http://127.0.0.1:{port}/api/v1/instances/"
            answers = [await fetch(url, fake.api_key), await fetch(url, "wrong")]
            params = {"limit": "25"}
            while True:
                answers.append(await fetch(url, fake.api_key, params))
                token = answers[-1][2].get("next_token")
                if not token:
                    return answers
                params = {"limit": "25", "after_token": token}

    answers = run(go)
    assert [status for status, _, _ in answers] == [429, 401, 200, 200]
    for status, content_type, body in answers:
        validate(VAST, "/api/v1/instances", status, content_type, body)
    assert len(answers[2][2]["instances"]) == 25 and answers[3][2]["next_token"] is None


def documented_example(document: dict[str, Any], schema_name: str) -> dict[str, Any]:
    """An object built from the `example` of each property of a 3.0 document's schema."""
    properties = document["components"]["schemas"][schema_name]["properties"]
    return {name: spec["example"] for name, spec in properties.items() if "example" in spec}


def test_the_documents_examples_read_as_the_reconciler_reads_them() -> None:
    [pod] = RUNPOD_V2["paths"]["/v2/pods"]["get"]["responses"]["200"]["content"]["application/json"][
        "examples"]["pods"]["value"]["pods"]
    box = runpod_boxes([pod])["7h9k2m4n6p"]
    assert (box.status, box.endpoints) == ("running", {22: Endpoint("195.26.233.3", 34446)})

    v1_pod = documented_example(RUNPOD_V1, "Pod")
    assert "desiredStatus" not in v1_pod  # documented by its enum only
    v1_pod["desiredStatus"] = RUNPOD_V1["components"]["schemas"]["Pod"]["properties"]["desiredStatus"]["enum"][0]
    assert v1_pod["portMappings"] == {"22": 10341} and v1_pod["publicIp"] == "100.65.0.119"
    box = runpod_v1_boxes([v1_pod])[v1_pod["id"]]
    assert (box.status, box.endpoints) == ("running", {22: Endpoint("100.65.0.119", 10341)})

    vast_item = VAST["paths"]["/api/v1/instances"]["get"]["responses"]["200"]["content"]["application/json"][
        "schema"]["properties"]["instances"]["items"]["properties"]
    example = {name: spec["example"] for name, spec in vast_item.items() if "example" in spec}
    boxes = vast_boxes([example])
    assert set(boxes) == {example["public_ipaddr"]}
    listed = boxes[example["public_ipaddr"]]
    assert listed.status == "running"
    assert listed.endpoints == {int(spec.split("/")[0]): Endpoint(example["public_ipaddr"], int(b[0]["HostPort"]))
                                for spec, b in example["ports"].items()}


@pytest.mark.parametrize("versions", [frozenset({"v1", "v2"}), frozenset({"v1"})])
def test_runpod_client_reads_v2_or_falls_back_to_v1(versions: frozenset[str]) -> None:
    """An account that answers v2 is read through v2; one whose v2 answers 404 (no beta) through v1, with
    the same boxes and endpoints either way."""
    fake = FakeRunPod(list(PODS), versions=versions)

    async def go():  # type: ignore[no-untyped-def]
        async with serve(fake.app()) as (port,), aiohttp.ClientSession() as session:
            return await RunPodClient(ProviderAccess(Secret(fake.api_key, "test"), f"http://127.0.0.1:{port}", 5, FAST)).list(session)

    listing = run(go)
    assert listing.ok, listing.error
    assert listing.boxes["k7v2m9x4q1w8e3"].endpoints == {22: Endpoint("203.0.113.7", 34446),
                                                        8001: Endpoint("203.0.113.7", 41010),
                                                        8002: Endpoint("203.0.113.7", 41011)}
    assert listing.boxes["starting01"].endpoints == {}
    assert runpod_v1_url(RUNPOD_URL) == RUNPOD_V1_URL and runpod_v1_url("http://x:1/") == "http://x:1/v1"


def test_a_runpod_v2_failure_other_than_404_is_not_hidden_by_v1() -> None:
    fake = FakeRunPod(list(PODS))

    async def go():  # type: ignore[no-untyped-def]
        async with serve(fake.app()) as (port,), aiohttp.ClientSession() as session:
            return await RunPodClient(ProviderAccess(Secret("wrong-key", "test"), f"http://127.0.0.1:{port}", 5, FAST)).list(session)

    listing = run(go)
    assert not listing.ok and "401" in (listing.error or "") and "/v2/pods" in (listing.error or "")
    assert "wrong-key" not in (listing.error or "")


def test_vast_client_pages_through_the_fake() -> None:
    instances = [vast_instance(i, f"192.0.2.{i}", {8001: 40000 + i}) for i in range(1, 61)]
    fake = FakeVast(instances)

    async def go():  # type: ignore[no-untyped-def]
        async with serve(fake.app()) as (port,), aiohttp.ClientSession() as session:
            return await VastClient(ProviderAccess(Secret(fake.api_key, "test"), f"http://127.0.0.1:{port}", 5, FAST)).list(session)

    listing = run(go)
    assert listing.ok and len(listing.boxes) == 60
    assert listing.boxes["192.0.2.7"].endpoints[8001] == Endpoint("192.0.2.7", 40007)
