"""The providers' rental operations, fakes and clients held to the published documents (tests/contracts/README.md):
RunPod's GPU catalog, `POST /pods` and `DELETE /pods/{id}` in REST v1 and v2; Vast's offer search
(`POST /api/v0/bundles`), `PUT /api/v0/asks/{id}/` and `DELETE /api/v0/instances/{id}/`. Every answer the fakes
serve is validated against the response schema the document gives for its path, method and status; every request
body the clients send is validated by the fakes against the request schema (a violation is a 400 and is kept)."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest

from fleetllm.adapters.providers import (
    ProviderAccess,
    RentalError,
    RunPodClient,
    RunPodRenter,
    VastClient,
    VastRenter,
    runpod_offers,
    vast_offers,
)
from fleetllm.core.capacity import Offer, RentRequest, pool_label
from fleetllm.core.fleet.model import Pool, Provider
from fleetllm.core.secret import Secret
from tests.contracts.test_provider_fakes import FAST, RUNPOD_V1, RUNPOD_V2, VAST, run
from tests.contracts.test_provider_fakes import validate as validate_answer
from tests.reconcile.fakes import FakeRunPod, FakeVast, runpod_gpu, serve, vast_offer

H100 = "NVIDIA H100 80GB HBM3"
RUNPOD_POOL = Pool("h100", Provider.RUNPOD, H100, 1, 1, 3.0, template="tmpl-fleetllm", regions=("US-KS-2",))
VAST_POOL = Pool("a100", Provider.VAST, "A100 SXM4", 1, 1, 1.5, image="vastai/vllm:v0.11.0", disk_gb=120)


def validate(document: dict[str, Any], path: str, method: str, status: int, content_type: str, body: Any) -> None:
    validate_answer(document, path, status, content_type, body, method)


async def call(method: str, url: str, key: str, body: Any = None) -> tuple[int, str, Any]:
    async with aiohttp.ClientSession() as session, session.request(
            method, url, headers={"Authorization": f"Bearer {key}"}, json=body) as response:
        raw = await response.read()
        return response.status, response.content_type, json.loads(raw) if raw else None


def no_body_documented(document: dict[str, Any], path: str, method: str, status: int) -> bool:
    return "content" not in document["paths"][path][method]["responses"][str(status)]


@pytest.mark.parametrize("version", ["v2", "v1"])
def test_every_runpod_rental_answer_matches_the_published_schema(version: str) -> None:
    fake = FakeRunPod(catalog=[runpod_gpu(H100, "H100 SXM", 2.69)])
    create_v2 = {"name": "fleetllm-h100-1", "gpu": {"id": H100, "count": 1}, "templateId": "tmpl-fleetllm"}
    create_v1 = {"name": "fleetllm-h100-1", "gpuTypeIds": [H100], "gpuCount": 1, "templateId": "tmpl-fleetllm"}

    async def go() -> list[tuple[int, str, Any]]:
        async with serve(fake.app()) as (port,):
            base = f"http://127.0.0.1:{port}"
            created = await call("POST", f"{base}/{version}/pods", fake.api_key,
                                 create_v2 if version == "v2" else create_v1)
            pod_id = created[2]["id"]
            return [await call("GET", f"{base}/v2/catalog/gpus", fake.api_key), created,
                    await call("POST", f"{base}/{version}/pods", "wrong", create_v2),
                    await call("DELETE", f"{base}/{version}/pods/{pod_id}", fake.api_key),
                    await call("DELETE", f"{base}/{version}/pods/{pod_id}", "wrong")]

    catalog, created, refused, deleted, unauthorised = run(go)
    assert [a[0] for a in (catalog, created, refused, deleted, unauthorised)] == [200, 201, 401, 204, 401]
    validate(RUNPOD_V2, "/v2/catalog/gpus", "get", *catalog)
    if version == "v2":
        validate(RUNPOD_V2, "/v2/pods", "post", *created)
        validate(RUNPOD_V2, "/v2/pods", "post", *refused)
        assert no_body_documented(RUNPOD_V2, "/v2/pods/{id}", "delete", 204) and deleted[2] is None
        validate(RUNPOD_V2, "/v2/pods/{id}", "delete", *unauthorised)
    else:  # v1 documents its 201 body; its errors and its 204 have none
        validate(RUNPOD_V1, "/pods", "post", *created)
        assert no_body_documented(RUNPOD_V1, "/pods/{podId}", "delete", 204) and deleted[2] is None
    assert created[2]["name"] == "fleetllm-h100-1" and fake.terminated == [created[2]["id"]]
    assert fake.violations == []


def test_every_vast_rental_answer_matches_the_published_schema() -> None:
    fake = FakeVast(offers=[vast_offer(4242, "A100 SXM4", 1.29), vast_offer(4343, "RTX 4090", 0.35)])
    query = {"limit": 5, "gpu_name": {"in": ["A100 SXM4"]}, "num_gpus": {"in": [1]}, "dph_total": {"lte": 1.5}}
    accept = {"image": "vastai/vllm:v0.11.0", "label": "fleetllm-a100-1", "target_state": "running"}

    async def go() -> list[tuple[int, str, Any]]:
        async with serve(fake.app()) as (port,):
            base = f"http://127.0.0.1:{port}/api/v0"
            answers = [await call("POST", f"{base}/bundles/", fake.api_key, query),
                       await call("POST", f"{base}/bundles/", "wrong", query),
                       await call("PUT", f"{base}/asks/4242/", fake.api_key, accept),
                       await call("PUT", f"{base}/asks/4242/", fake.api_key, accept),  # taken: gone
                       await call("PUT", f"{base}/asks/4343/", "wrong", accept)]
            contract = answers[2][2]["new_contract"]
            answers += [await call("DELETE", f"{base}/instances/{contract}/", fake.api_key),
                        await call("DELETE", f"{base}/instances/{contract}/", fake.api_key)]
            return answers

    answers = run(go)
    assert [a[0] for a in answers] == [200, 404, 200, 404, 401, 200, 404]
    search, refused, accepted, gone, unauthorised, destroyed, missing = answers
    for status, content_type, body in (search, refused):
        validate(VAST, "/api/v0/bundles", "post", status, content_type, body)
    assert [o["id"] for o in search[2]["offers"]] == [4242]
    for status, content_type, body in (accepted, gone, unauthorised):
        validate(VAST, "/api/v0/asks/{id}", "put", status, content_type, body)
    for status, content_type, body in (destroyed, missing):
        validate(VAST, "/api/v0/instances/{id}", "delete", status, content_type, body)
    assert fake.violations == []


def test_the_fakes_refuse_a_request_the_documents_do_not_allow() -> None:
    """What holds the clients to the documents: a body outside the request schema is a 400, kept."""
    vast, runpod = FakeVast(offers=[vast_offer(1, "A100 SXM4", 1.0)]), FakeRunPod()

    async def go() -> tuple[int, int]:
        async with serve(vast.app()) as (vport,), serve(runpod.app()) as (rport,):
            no_image = await call("PUT", f"http://127.0.0.1:{vport}/api/v0/asks/1/", vast.api_key, {"label": "x"})
            bad_gpu = await call("POST", f"http://127.0.0.1:{rport}/v2/pods", runpod.api_key,
                                 {"name": "x", "gpu": {"id": H100, "count": 0}})
            return no_image[0], bad_gpu[0]

    assert run(go) == (400, 400)
    assert any("'image' is a required property" in v for v in vast.violations)
    assert any("gpu/count" in v for v in runpod.violations)


def access(key: str, port: int) -> ProviderAccess:
    return ProviderAccess(Secret(key, "test"), f"http://127.0.0.1:{port}", 5, FAST)


def request(pool: Pool, offer: Offer) -> RentRequest:
    return RentRequest(pool.name, pool_label(pool.name, 1), pool.provider, offer.gpu, pool.gpus, offer.ask,
                       pool.max_per_hour, pool.image, pool.template, pool.regions, pool.disk_gb)


@pytest.mark.parametrize("versions", [frozenset({"v1", "v2"}), frozenset({"v1"})])
def test_runpod_renter_prices_rents_and_terminates_through_the_fake(versions: frozenset[str]) -> None:
    """The client's requests pass the fake's checks, in v2 or (an account without the v2 beta) v1; the new pod
    is listed under its label with its price, then gone. It is named by its label: its environment sets
    LLMAO_HOST (what runpod.sh presents the box as) to it, and the listing names the pod so too."""
    fake = FakeRunPod(catalog=[runpod_gpu(H100, "H100 SXM", 2.69), runpod_gpu("NVIDIA L4", "L4", 0.43)],
                      versions=versions)

    async def go():  # type: ignore[no-untyped-def]
        async with serve(fake.app()) as (port,), aiohttp.ClientSession() as session:
            renter, lister = RunPodRenter(access(fake.api_key, port)), RunPodClient(access(fake.api_key, port))
            offers = await renter.offers(session, RUNPOD_POOL) if "v2" in versions else \
                [Offer(Provider.RUNPOD, H100, "H100 SXM", 1, 2.69)]
            rented = await renter.rent(session, request(RUNPOD_POOL, offers[0]))
            listed = await lister.list(session)
            await renter.terminate(session, rented.ident)
            await renter.terminate(session, rented.ident)  # already gone: fine
            return offers, rented, listed, await lister.list(session)

    offers, rented, listed, after = run(go)
    assert offers == [Offer(Provider.RUNPOD, H100, "H100 SXM", 1, 2.69)]
    assert (rented.box, rented.per_hour) == ("fleetllm-h100-1", 2.69) and rented.ident.startswith("newpod")
    pod = listed.rentals[rented.ident]
    assert (pod.label, pod.price, pod.status) == ("fleetllm-h100-1", 2.69, "provisioning" if "v2" in versions
                                                  else "running")
    assert fake.terminated == [rented.ident] and fake.violations == []
    named = listed.boxes["fleetllm-h100-1"]
    assert (named.box, named.ident, named.price) == ("fleetllm-h100-1", f"pod {rented.ident}", 2.69)
    assert listed.boxes[rented.ident].box == rented.ident  # still listed under its pod id (approved by hand)
    assert after.rentals == {} and "fleetllm-h100-1" not in after.boxes


def test_vast_renter_searches_accepts_and_destroys_through_the_fake() -> None:
    fake = FakeVast(offers=[vast_offer(11, "A100 SXM4", 1.45), vast_offer(12, "A100 SXM4", 1.29),
                            vast_offer(13, "A100 SXM4", 1.80), vast_offer(14, "RTX 4090", 0.3)])

    async def go():  # type: ignore[no-untyped-def]
        async with serve(fake.app()) as (port,), aiohttp.ClientSession() as session:
            renter, lister = VastRenter(access(fake.api_key, port)), VastClient(access(fake.api_key, port))
            offers = await renter.offers(session, VAST_POOL)
            cheapest = min(offers, key=lambda o: o.per_hour)
            rented = await renter.rent(session, request(VAST_POOL, cheapest))
            listed = await lister.list(session)
            await renter.terminate(session, rented.ident)
            return offers, rented, listed, await lister.list(session)

    offers, rented, listed, after = run(go)
    assert sorted(o.per_hour for o in offers) == [1.29, 1.45]  # the search's ceiling is the pool's max_per_hour
    assert offers[0].region == "US"
    assert rented.box == "fleetllm-a100-1"  # named by its label (its environment's LLMAO_HOST, vast.sh presents it)
    assert fake.accepted[0]["env"] == "-e LLMAO_HOST=fleetllm-a100-1"
    box = listed.rentals[rented.ident]
    assert (box.label, box.price, box.gpu) == ("fleetllm-a100-1", 1.29, "A100 SXM4")
    named = listed.boxes["fleetllm-a100-1"]
    assert (named.box, named.ident, named.status, dict(named.endpoints)) == (
        "fleetllm-a100-1", f"instance {rented.ident}", "loading", {})  # no endpoint until it runs
    assert after.rentals == {} and fake.violations == [] and fake.destroyed == [int(rented.ident)]


def test_a_refused_rental_says_which_and_hides_the_key() -> None:
    fake = FakeVast(offers=[])

    async def go() -> str:
        async with serve(fake.app()) as (port,), aiohttp.ClientSession() as session:
            try:
                await VastRenter(access(fake.api_key, port)).rent(
                    session, request(VAST_POOL, Offer(Provider.VAST, "999", "A100 SXM4", 1, 1.0)))
            except RentalError as exc:
                return str(exc)
            return "rented"

    message = run(go)
    assert "Vast PUT /api/v0/asks/999/ (fleetllm-a100-1): HTTP 404" in message and fake.api_key not in message


def test_offer_readers_take_the_documents_shapes() -> None:
    example = VAST["paths"]["/api/v0/bundles"]["post"]["responses"]["200"]["content"]["application/json"]["example"]
    offer = example["offers"]  # the document's example gives one offer object where its schema says a list
    [read] = vast_offers({"offers": [offer]}, VAST_POOL)
    assert (read.ask, read.per_hour, read.gpus, read.gpu) == (str(offer["id"]), offer["dph_total"],
                                                              offer["num_gpus"], offer["gpu_name"])
    with pytest.raises(RentalError, match="no `offers` list"):
        vast_offers(example, VAST_POOL)
    catalog = {"gpus": [runpod_gpu(H100, "H100 SXM", 2.69), runpod_gpu("NVIDIA L4", "L4", 0.43)]}
    validate(RUNPOD_V2, "/v2/catalog/gpus", "get", 200, "application/json", catalog)
    two = Pool("h100x2", Provider.RUNPOD, H100, 2, 1, 9.0)
    assert runpod_offers(catalog, two) == [Offer(Provider.RUNPOD, H100, "H100 SXM", 2, 5.38)]
