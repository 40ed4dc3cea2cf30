"""Conformance group 3: the models API, served from the config (llmhop.md §5)."""

from __future__ import annotations

import concurrent.futures

from tests.gateway.conftest import GatewayProcess, Upstreams, reference_config, running_gateway
from tests.gateway.upstreams import holding


def test_list_is_sorted_exact_and_hides_unlisted(gw: GatewayProcess) -> None:
    reply = gw.request("GET", "/v1/models")
    assert reply.status == 200
    assert reply.header("Content-Type") == "application/json"
    assert reply.body.endswith(b"}\n")
    document = reply.json()
    assert list(document) == ["object", "data"]
    assert document["object"] == "list"
    assert [m["id"] for m in document["data"]] == ["Qwen/Qwen3-8B", "dead", "echo", "injected", "sock"]
    for entry in document["data"]:
        assert list(entry) == ["id", "object", "created", "owned_by"]
        assert entry["object"] == "model"
        assert entry["owned_by"] == "llmhop"
        assert isinstance(entry["created"], int)


def test_created_is_fixed_at_start_up(gw: GatewayProcess) -> None:
    first = gw.request("GET", "/v1/models").json()
    second = gw.request("GET", "/v1/models").json()
    assert first == second
    assert len({m["created"] for m in first["data"]}) == 1


def test_retrieve_listed_unlisted_unknown(gw: GatewayProcess) -> None:
    listed = gw.request("GET", "/v1/models/echo")
    assert listed.status == 200
    assert listed.json() == gw.request("GET", "/v1/models").json()["data"][2]
    for name in ("hidden", "nope"):
        reply = gw.request("GET", f"/v1/models/{name}")
        assert reply.status == 404
        assert reply.json()["error"]["message"] == f'unknown model "{name}"'
        assert reply.json()["error"]["code"] == "model_not_found"


def test_retrieve_decodes_percent_2f(gw: GatewayProcess) -> None:
    reply = gw.request("GET", "/v1/models/Qwen%2FQwen3-8B")
    assert reply.status == 200
    assert reply.json()["id"] == "Qwen/Qwen3-8B"


def test_two_segments_fall_through_to_body_routing(gw: GatewayProcess) -> None:
    reply = gw.request("GET", "/v1/models/Qwen/Qwen3-8B")
    assert reply.status == 400
    assert reply.json()["error"]["message"] == "invalid JSON request body"


def test_post_v1_models_is_body_routed(gw: GatewayProcess) -> None:
    reply = gw.request("POST", "/v1/models", body=b'{"model":"echo"}')
    assert reply.status == 200
    assert reply.json()["path"] == "/base/v1/models?backend=1"


def test_empty_list_when_every_model_is_unlisted(upstreams: Upstreams) -> None:
    config = reference_config(upstreams, models={"hidden": {"url": upstreams.base_url, "unlisted": True}})
    with running_gateway(config) as gateway:
        assert gateway.request("GET", "/v1/models").json() == {"object": "list", "data": []}
        assert gateway.request("GET", "/health", token=None).json() == {"status": "ok", "models": 0}


def test_models_api_takes_no_slot(gw: GatewayProcess) -> None:
    # Both slots held by slow requests; the models API still answers at once.
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        with holding():  # both stay in flight however slowly they start
            slow = [pool.submit(gw.request, "POST", "/held", b'{"model":"echo"}') for _ in range(2)]
            gw.wait_in_flight("echo", 2)
            assert gw.request("GET", "/v1/models").status == 200
            assert gw.request("GET", "/v1/models/echo").status == 200
            assert gw.request("POST", "/slow", body=b'{"model":"echo"}').status == 503
        assert [f.result().status for f in slow] == [200, 200]

