"""Local HTTP fakes speaking the recorded wire formats (../shared/reference/wire-formats.md): vLLM's
/health and /v1/models (one process can play many servers, one per listening port), Vast's v1
instances listing with keyset paging and 429s, RunPod's v2 pods. Real sockets on loopback, ephemeral
ports. Used by the adapter tests and by bench/."""

from __future__ import annotations

import asyncio
import base64
import json
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from fleetllm.demo.procs import free_port as free_port  # re-exported for this package's tests
from fleetllm.demo.runpod import FakeRunPod as ShippedRunPod
from fleetllm.demo.runpod import Validate
from fleetllm.demo.runpod import problem as problem  # re-exported for this package's tests
from fleetllm.demo.runpod import runpod_gpu as runpod_gpu
from fleetllm.demo.runpod import runpod_pod as runpod_pod
from fleetllm.demo.runpod import runpod_pod_v1 as runpod_pod_v1
from fleetllm.demo.runpod import serve as serve
from tests.contracts.openapi import load, problems, request_schema

VAST_DOCUMENT = load("vast.openapi.yaml")
RUNPOD_V1_DOCUMENT = load("runpod-rest-v1.openapi.json")
RUNPOD_V2_DOCUMENT = load("runpod-rest-v2.openapi.json")


@dataclass
class FakeServer:
    served_name: str
    bearer: str
    root: str = "org/model"
    max_model_len: int = 4096
    mode: str = "ok"  # ok | hang | unhealthy | not-json


def model_card(name: str, root: str, max_model_len: int) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": 1764440000, "owned_by": "vllm", "root": root, "parent": None,
            "max_model_len": max_model_len,
            "permission": [{"id": "modelperm-3f0c", "object": "model_permission", "created": 1764440000,
                            "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
                            "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
                            "organization": "*", "group": None, "is_blocking": False}]}


@dataclass
class FakeVllm:
    """Many vLLM servers in one process: the listening address picks the server (key: port, or
    (host, port) when several loopback addresses share port numbers)."""

    servers: dict[int | tuple[str, int], FakeServer] = field(default_factory=dict)
    requests: int = 0
    chats: list[tuple[int, str]] = field(default_factory=list)  # (port, model) of each chat completion

    def _server(self, request: web.Request) -> FakeServer:
        sock = request.transport.get_extra_info("sockname") if request.transport else None
        assert sock is not None
        return self.servers.get((str(sock[0]), int(sock[1]))) or self.servers[int(sock[1])]

    async def health(self, request: web.Request) -> web.Response:
        self.requests += 1
        server = self._server(request)
        if server.mode == "hang":
            await asyncio.sleep(3600)
        if server.mode == "unhealthy":
            return web.Response(status=503)
        return web.Response(status=200)

    async def models(self, request: web.Request) -> web.Response:
        self.requests += 1
        server = self._server(request)
        if request.headers.get("Authorization", "") != f"Bearer {server.bearer}":
            return web.json_response({"error": "Unauthorized"}, status=401)
        if server.mode == "not-json":
            return web.Response(text="<html>hello</html>", content_type="text/html")
        return web.json_response({"object": "list",
                                  "data": [model_card(server.served_name, server.root, server.max_model_len)]})

    async def chat(self, request: web.Request) -> web.Response:
        server = self._server(request)
        if request.headers.get("Authorization", "") != f"Bearer {server.bearer}":
            return web.json_response({"error": "Unauthorized"}, status=401)
        body = await request.json()
        port = int(request.transport.get_extra_info("sockname")[1]) if request.transport else 0
        self.chats.append((port, str(body.get("model"))))
        if body.get("model") != server.served_name:
            return web.json_response({"error": {"message": f"The model `{body.get('model')}` does not exist.",
                                                "type": "NotFoundError", "param": None, "code": 404}}, status=404)
        text = f"served by {request.host} as {server.served_name}"
        return web.json_response({
            "id": "chatcmpl-1", "object": "chat.completion", "created": 1764440000, "model": server.served_name,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}})

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/chat/completions", self.chat)
        return app


def _token(offset: int) -> str:
    return base64.urlsafe_b64encode(json.dumps({"o": offset}).encode()).decode()


@dataclass
class FakeVast:
    """`GET /api/v1/instances/`: keyset paging (limit <= 25, next_token), 429 on the first `throttle` calls."""

    instances: list[dict[str, Any]] = field(default_factory=list)
    api_key: str = "vast-test-key"
    throttle: int = 0
    calls: int = 0

    async def list(self, request: web.Request) -> web.Response:
        self.calls += 1
        if request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return web.json_response({"success": False, "error": "auth_error", "msg": "Invalid API key"}, status=401)
        if self.calls <= self.throttle:
            return web.json_response({"detail": "API requests too frequent endpoint threshold=1.0"}, status=429,
                                     headers={"Retry-After": "0"})
        limit = min(int(request.query.get("limit", "25")), 25)
        token = request.query.get("after_token")
        offset = json.loads(base64.urlsafe_b64decode(token))["o"] if token else 0
        page = self.instances[offset:offset + limit]
        more = offset + limit < len(self.instances)
        return web.json_response({"success": True, "instances_found": len(page), "total_instances": len(self.instances),
                                  "label_counts": {}, "next_token": _token(offset + limit) if more else None,
                                  "instances": page})

    # Renting (tests/contracts/vast.openapi.yaml): offer search, accept an ask, destroy an instance. Every request
    # body is checked against the published request schema: a violation is answered 400 and kept in `violations`.
    offers: list[dict[str, Any]] = field(default_factory=lambda: [])  # (`list` is the method above here)
    violations: list[str] = field(default_factory=lambda: [])  # (`list` is the method above here)
    next_contract: int = 9_000_001
    destroyed: list[int] = field(default_factory=lambda: [])  # (`list` is the method above here)
    accepted: list[dict[str, Any]] = field(default_factory=lambda: [])  # the bodies of the asks accepted

    def _auth(self, request: web.Request) -> bool:
        return request.headers.get("Authorization") == f"Bearer {self.api_key}"

    async def _body(self, request: web.Request, path: str, method: str) -> tuple[Any, web.Response | None]:
        body = await request.json()
        wrong = problems(request_schema(VAST_DOCUMENT, path, method, "application/json"), body)
        if wrong:
            self.violations += [f"{method.upper()} {path}: {p}" for p in wrong]
            return body, web.json_response({"success": False, "error": "invalid_args", "msg": "; ".join(wrong)},
                                           status=400)
        return body, None

    async def search(self, request: web.Request) -> web.Response:
        if not self._auth(request):  # the document answers an unknown key with 404 here
            return web.json_response({"error": "auth_error", "msg": "Invalid user key"}, status=404)
        query, refused = await self._body(request, "/api/v0/bundles", "post")
        if refused is not None:
            return web.json_response({"error": "invalid_request", "msg": refused.text}, status=400)
        names = set(query.get("gpu_name", {}).get("in", [])) or None
        counts = set(query.get("num_gpus", {}).get("in", [])) or None
        ceiling = query.get("dph_total", {}).get("lte")
        found = [o for o in self.offers if (names is None or o["gpu_name"] in names)
                 and (counts is None or o["num_gpus"] in counts) and (ceiling is None or o["dph_total"] <= ceiling)]
        return web.json_response({"offers": found[:int(query.get("limit", 64))]})

    async def accept(self, request: web.Request) -> web.Response:
        if not self._auth(request):
            return web.json_response({"success": False, "error": "auth_error", "msg": "Invalid API key"}, status=401)
        body, refused = await self._body(request, "/api/v0/asks/{id}", "put")
        if refused is not None:
            return refused
        ask = int(request.match_info["ask"])
        offer = next((o for o in self.offers if o["id"] == ask), None)
        if offer is None:
            return web.json_response({"success": False, "error": "invalid_args", "ask_id": ask,
                                      "msg": f"error 404/3603: no_such_ask Instance type by id {ask} is not available."},
                                     status=404)
        self.offers.remove(offer)
        self.accepted.append(body)
        contract, self.next_contract = self.next_contract, self.next_contract + 1
        item = vast_instance(contract, offer.get("public_ipaddr", f"198.18.0.{contract % 250}"), None,
                             status="loading", label=body.get("label"))
        item.update(gpu_name=offer["gpu_name"], num_gpus=offer["num_gpus"], dph_total=offer["dph_total"])
        self.instances.append(item)
        return web.json_response({"success": True, "new_contract": contract})

    async def destroy(self, request: web.Request) -> web.Response:
        if not self._auth(request):
            return web.json_response({"success": False, "error": "auth_error", "msg": "Invalid API key"}, status=401)
        ident = int(request.match_info["instance"])
        item = next((i for i in self.instances if i["id"] == ident), None)
        if item is None:
            return web.json_response({"success": False, "error": "not_found", "msg": "Instance not found"}, status=404)
        self.instances.remove(item)
        self.destroyed.append(ident)
        return web.json_response({"success": True, "msg": "Instance destroyed successfully"})

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/api/v1/instances/", self.list)
        app.router.add_post("/api/v0/bundles/", self.search)
        app.router.add_put("/api/v0/asks/{ask:[0-9]+}/", self.accept)
        app.router.add_delete("/api/v0/instances/{instance:[0-9]+}/", self.destroy)
        return app


def vast_offer(ident: int, gpu: str, price: float, gpus: int = 1, where: str = "Texas, US") -> dict[str, Any]:
    """An offer as Vast's search answers it (after the document's example; the fields the reconciler reads)."""
    return {"id": ident, "ask_contract_id": ident, "bundle_id": ident * 10, "gpu_name": gpu, "num_gpus": gpus,
            "gpu_ram": 81559, "dph_total": price, "dph_base": round(price * 0.9, 4), "geolocation": where,
            "reliability": 0.998, "rentable": True, "rented": False, "verified": True, "machine_id": ident + 7,
            "public_ipaddr": f"198.18.{ident % 250}.{ident % 200 + 1}", "cuda_max_good": 12.8, "disk_space": 200.0}


ANY_V4 = "0.0.0.0"  # noqa: S104 (Docker's binding as Vast lists it)


def vast_instance(ident: int, ip: str, ports: dict[int, int] | None, status: str = "running",
                  label: str | None = None) -> dict[str, Any]:
    item: dict[str, Any] = {"id": ident, "label": label, "actual_status": status, "intended_status": "running",
                            "cur_state": "running", "public_ipaddr": ip, "machine_id": 12, "gpu_name": "RTX 4090",
                            "num_gpus": 1, "gpu_ram": 24576, "disk_space": 10.08,
                            "image_uuid": "vllm/vllm-openai:latest",
                            "extra_env": [["HF_HOME", "/workspace/hf"], ["-p 8001:8001", "1"]]}
    if ports is not None:
        item["ports"] = {f"{listen}/tcp": [{"HostIp": ANY_V4, "HostPort": str(public)},
                                           {"HostIp": "::", "HostPort": str(public)}]
                         for listen, public in ports.items()}
        item["ports"]["22/tcp"] = [{"HostIp": ANY_V4, "HostPort": "20000"}]
    return item


def _validate_runpod(version: str, body: Any) -> list[str]:
    """A create request's problems against RunPod's published document of that version."""
    document, path = (RUNPOD_V2_DOCUMENT, "/v2/pods") if version == "v2" else (RUNPOD_V1_DOCUMENT, "/pods")
    return problems(request_schema(document, path, "post", "application/json"), body)


@dataclass
class FakeRunPod(ShippedRunPod):
    """The demo's simulated RunPod (fleetllm.demo.runpod) with every create request's body checked against the
    published REST documents kept in tests/contracts (400 and `violations` if not)."""

    validate: Validate | None = _validate_runpod


@dataclass
class FakeLitellmHttp:
    """LiteLLM's model API over HTTP, in memory, with the observed semantics: ids of our choosing,
    duplicate id -> 500, PATCH merges litellm_params, delete of a missing id -> 400, paging with
    total_pages, api_key never listed."""

    master_key: str = "sk-fake-master"
    rows: dict[str, dict[str, Any]] = field(default_factory=dict)
    fail_deletes: int = 0  # answer the next N deletes with a 503

    def _auth(self, request: web.Request) -> web.Response | None:
        if request.headers.get("Authorization") != f"Bearer {self.master_key}":
            return web.json_response({"error": {"message": "Authentication Error", "code": "401"}}, status=401)
        return None

    @staticmethod
    def _listed(row: dict[str, Any]) -> dict[str, Any]:
        params = {k: v for k, v in row["litellm_params"].items() if k != "api_key"}
        return {"model_name": row["model_name"], "litellm_params": params,
                "model_info": {**row["model_info"], "db_model": True}}

    async def info(self, request: web.Request) -> web.Response:
        if (denied := self._auth(request)) is not None:
            return denied
        if "modelId" in request.query:  # rows are keyed by model_info.id: a lookup, not a scan (bench/)
            found = self.rows.get(request.query["modelId"])
            rows = [found] if found is not None else []
        else:
            rows = list(self.rows.values())
        size = int(request.query.get("size", "50"))
        page = int(request.query.get("page", "1"))
        pages = (len(rows) + size - 1) // size
        chunk = rows[(page - 1) * size:page * size]
        return web.json_response({"data": [self._listed(r) for r in chunk], "total_count": len(rows),
                                  "current_page": page, "total_pages": pages, "size": size})

    async def new(self, request: web.Request) -> web.Response:
        if (denied := self._auth(request)) is not None:
            return denied
        body = await request.json()
        ident = body["model_info"]["id"]
        if ident in self.rows:
            return web.json_response({"error": {"message": "{'error': 'Failed to add model to db. Check your server "
                                                           "logs for more details.'}", "code": "500"}}, status=500)
        self.rows[ident] = body
        return web.json_response({"model_id": ident, **body})

    async def update(self, request: web.Request) -> web.Response:
        if (denied := self._auth(request)) is not None:
            return denied
        ident = request.match_info["ident"]
        body = await request.json()
        row = self.rows.get(ident)
        if row is None:
            return web.json_response({"error": {"message": f"Model with id={ident} not found", "code": "400"}},
                                     status=400)
        row["litellm_params"] = {**row["litellm_params"], **body.get("litellm_params", {})}
        row["model_info"] = body.get("model_info", row["model_info"])
        row["model_name"] = body.get("model_name", row["model_name"])
        return web.json_response({"model_id": ident, **row})

    async def delete(self, request: web.Request) -> web.Response:
        if (denied := self._auth(request)) is not None:
            return denied
        ident = (await request.json())["id"]
        if self.fail_deletes > 0:
            self.fail_deletes -= 1
            return web.json_response({"error": {"message": "database is unavailable", "code": "503"}}, status=503)
        if self.rows.pop(ident, None) is None:
            return web.json_response({"error": {"message": f"{{'error': 'Model with id={ident} not found in db'}}",
                                                "type": "auth_error", "param": "None", "code": "400"}}, status=400)
        return web.json_response({"message": f"Model: {ident} deleted successfully"})

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v2/model/info", self.info)
        app.router.add_post("/model/new", self.new)
        app.router.add_patch("/model/{ident}/update", self.update)
        app.router.add_post("/model/delete", self.delete)
        return app
