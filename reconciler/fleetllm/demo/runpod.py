"""SIMULATED RunPod: the pod API of RunPod's published REST documents (v1 and v2: list, the GPU catalog, create
and terminate a pod), in memory, over real HTTP on loopback. The demo's `rent-box` scenario rents from it
(demo/rentals.py boots a simulated box for each pod it creates); the adapter and contract tests run it with
every request body checked against the documents kept in tests/contracts (tests/reconcile/fakes.py sets
`validate`).

- `GET /v2/pods` -> {"pods": [Pod]}; `GET /v1/pods` -> [Pod], the v1 pods rendered from the same v2 ones.
  `versions` says which the "account" answers: one left out answers 404, as for an account without the v2 beta.
- `GET /v2/catalog/gpus`, `POST /v2/pods` and `/v1/pods` (201 with the new pod, PROVISIONING, no runtime),
  `DELETE /v2/pods/{id}` and `/v1/pods/{id}` (204; 404 for a pod it does not know).
- Errors are RFC 9457 problems (v2's; v1 documents none, so it answers the same).

`on_create` and `on_terminate` are called on the server's event loop with the pod (its id); they must not
block. `start_pod` (a pod's container started: RUNNING, its ports mapped) is for the same loop too:
`ProviderThread.call` runs it there from another thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from fleetllm.demo.fleet import DemoError

Validate = Callable[[str, Any], list[str]]  # (version, request body) -> what is wrong with it


def problem(status: int, title: str, detail: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"title": title, "status": status, "detail": detail}, status=status, headers=headers,
                             content_type="application/problem+json")


def runpod_gpu(ident: str, name: str, secure: float, memory: int = 80) -> dict[str, Any]:
    """A `GpuType` of RunPod's v2 catalog with every field its schema requires."""
    return {"id": ident, "name": name, "pool": None, "manufacturer": "NVIDIA", "memory": memory, "secure": True,
            "community": True, "price": {"secure": secure, "community": round(secure * 0.8, 2)},
            "maxCount": {"secure": 8, "community": 4}}


def runtime(ports: Mapping[int, int], ip: str) -> dict[str, Any]:
    """A running pod's `runtime`: ssh on 22 and each listen port mapped to its public port at `ip`."""
    return {"uptime": 60, "ports": [
        {"private": 22, "public": 34446, "type": "tcp", "ip": ip},
        *({"private": listen, "public": public, "type": "tcp", "ip": ip} for listen, public in ports.items())]}


def runpod_pod(pod_id: str, ports: dict[int, int] | None, status: str = "RUNNING",
               ip: str = "127.0.0.1") -> dict[str, Any]:
    """A v2 `Pod` with every field the published schema requires (shaped after its documented example)."""
    running = ports is not None
    direct = {"host": ip, "port": 34446, "username": "root", "command": f"ssh root@{ip} -p 34446"} if running else None
    return {"id": pod_id, "name": pod_id, "image": "fleetllm/vllm:1", "args": "", "disk": 50,
            "ports": ["8001/tcp", "22/tcp"], "env": {}, "registry": None, "status": status,
            "actions": ["stop", "restart", "terminate"] if running else ["terminate"],
            "mounts": {"persistent": {"size": 100, "path": "/workspace"}},
            "gpu": {"id": "NVIDIA H100 80GB HBM3", "count": 1}, "cloud": "SECURE", "dataCenterId": "US-KS-2",
            "cudaVersion": "12.8",
            "ssh": {"proxy": {"host": "ssh.runpod.io", "port": 22, "username": f"{pod_id}-64411eb2",
                              "command": f"ssh {pod_id}-64411eb2@ssh.runpod.io"}, "direct": direct},
            "template": None, "cost": 2.69 if running else 0.0, "locked": False, "globalNetworking": {"enabled": False},
            "runtime": runtime(ports, ip) if ports is not None else None, "createdAt": "2026-11-01T12:00:00Z",
            "startedAt": "2026-11-01T12:02:00Z" if running else None}


def runpod_pod_v1(pod: dict[str, Any]) -> dict[str, Any]:
    """The same pod as REST v1 lists it: `desiredStatus`, `publicIp`, `portMappings` of its TCP ports."""
    tcp = [p for p in (pod.get("runtime") or {}).get("ports") or [] if p.get("type") == "tcp" and p.get("public")]
    desired = {"RUNNING": "RUNNING", "STARTING": "RUNNING", "PROVISIONING": "RUNNING", "TERMINATED": "TERMINATED"}
    return {"id": pod["id"], "name": pod["name"], "image": pod["image"],
            "desiredStatus": desired.get(pod["status"], "EXITED"),
            "publicIp": tcp[0]["ip"] if tcp else None,
            "portMappings": {str(p["private"]): p["public"] for p in tcp} if tcp else None,
            "ports": pod["ports"], "env": pod["env"], "containerDiskInGb": pod["disk"], "volumeInGb": 100,
            "volumeMountPath": "/workspace", "costPerHr": pod["cost"], "adjustedCostPerHr": pod["cost"],
            "gpu": {"id": pod["gpu"]["id"], "count": pod["gpu"]["count"], "displayName": "H100 SXM"},
            "machineId": "s194cr8pls2z", "locked": False, "interruptible": False, "memoryInGb": 125, "vcpuCount": 16,
            "lastStatusChange": "Rented by User: Sun Nov 01 2026 12:02:00 GMT+0000",
            "lastStartedAt": pod["startedAt"] or "2026-11-01T12:02:00Z"}


@dataclass
class FakeRunPod:
    """RunPod's pod API in memory (the module's docstring)."""

    pods: list[dict[str, Any]] = field(default_factory=list)
    api_key: str = "runpod-test-key"
    throttle: int = 0  # answer the first N calls 429
    calls: int = 0
    versions: frozenset[str] = frozenset({"v1", "v2"})
    catalog: list[dict[str, Any]] = field(default_factory=lambda: [])  # (`list` is a method here)
    violations: list[str] = field(default_factory=lambda: [])  # request bodies `validate` refused
    created: int = 0
    terminated: list[str] = field(default_factory=lambda: [])
    validate: Validate | None = None
    on_create: Callable[[dict[str, Any]], None] | None = None
    on_terminate: Callable[[str], None] | None = None

    def _refuse(self, request: web.Request, version: str) -> web.Response | None:
        self.calls += 1
        if version not in self.versions:
            return problem(404, "Not Found", f"no {version} API for this account")
        if request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return problem(401, "Unauthorized", "invalid bearer token")
        if self.calls <= self.throttle:
            return problem(429, "Too Many Requests", "rate limit exceeded for the minute window",
                           {"Retry-After": "0"})
        return None

    async def list(self, request: web.Request) -> web.Response:
        return self._refuse(request, "v2") or web.json_response({"pods": self.pods})

    async def list_v1(self, request: web.Request) -> web.Response:
        return self._refuse(request, "v1") or web.json_response([runpod_pod_v1(pod) for pod in self.pods])

    async def gpus(self, request: web.Request) -> web.Response:
        return self._refuse(request, "v2") or web.json_response({"gpus": self.catalog})

    async def _create(self, request: web.Request, version: str) -> web.Response:
        refused = self._refuse(request, version)
        if refused is not None:
            return refused
        body = await request.json()
        path, schema = ("/v2/pods", "CreatePodRequest") if version == "v2" else ("/pods", "PodCreateInput")
        wrong = self.validate(version, body) if self.validate is not None else []
        if wrong:
            self.violations += [f"POST {path}: {p}" for p in wrong]
            return problem(400, "Bad Request", f"{schema}: " + "; ".join(wrong))
        gpu = body["gpu"]["id"] if version == "v2" else body["gpuTypeIds"][0]
        count = body["gpu"].get("count", 1) if version == "v2" else body.get("gpuCount", 1)
        known = next((g for g in self.catalog if g["id"] == gpu), None)
        self.created += 1
        pod = runpod_pod(f"newpod{self.created:08d}", None, status="PROVISIONING")
        pod.update(name=body["name"], gpu={"id": gpu, "count": count},
                   cost=round((known["price"]["secure"] if known else 1.0) * count, 4),
                   image=body.get("image") or body.get("imageName") or "from-template",
                   template=body.get("templateId"), env=dict(body.get("env") or {}))
        self.pods.append(pod)
        if self.on_create is not None:
            self.on_create(dict(pod))
        return web.json_response(pod if version == "v2" else runpod_pod_v1(pod), status=201)

    async def create(self, request: web.Request) -> web.Response:
        return await self._create(request, "v2")

    async def create_v1(self, request: web.Request) -> web.Response:
        return await self._create(request, "v1")

    async def _terminate(self, request: web.Request, version: str) -> web.Response:
        refused = self._refuse(request, version)
        if refused is not None:
            return refused
        pod_id = request.match_info["pod"]
        pod = next((p for p in self.pods if p["id"] == pod_id), None)
        if pod is None:
            return problem(404, "Not Found", f"no pod {pod_id}")
        self.pods.remove(pod)
        self.terminated.append(pod_id)
        if self.on_terminate is not None:
            self.on_terminate(pod_id)
        return web.Response(status=204)

    async def terminate(self, request: web.Request) -> web.Response:
        return await self._terminate(request, "v2")

    async def terminate_v1(self, request: web.Request) -> web.Response:
        return await self._terminate(request, "v1")

    def start_pod(self, pod_id: str, ports: Mapping[int, int], ip: str) -> bool:
        """The pod's container started: RUNNING, each listen port mapped to `ports[listen]` at `ip` (False: no
        such pod, terminated meanwhile)."""
        pod = next((p for p in self.pods if p["id"] == pod_id), None)
        if pod is None:
            return False
        pod.update(status="RUNNING", runtime=runtime(ports, ip), startedAt="2026-11-01T12:02:00Z",
                   actions=["stop", "restart", "terminate"])
        return True

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v2/pods", self.list)
        app.router.add_get("/v1/pods", self.list_v1)
        app.router.add_get("/v2/catalog/gpus", self.gpus)
        app.router.add_post("/v2/pods", self.create)
        app.router.add_post("/v1/pods", self.create_v1)
        app.router.add_delete("/v2/pods/{pod}", self.terminate)
        app.router.add_delete("/v1/pods/{pod}", self.terminate_v1)
        return app


@contextlib.asynccontextmanager
async def serve(app: web.Application, ports: Sequence[int] = (0,), host: str = "127.0.0.1",
                backlog: int = 1024) -> AsyncIterator[list[int]]:
    """Serve `app` on each port (0 = ephemeral); yields the bound ports."""
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    bound: list[int] = []
    try:
        for port in ports:
            site = web.TCPSite(runner, host, port, backlog=backlog, reuse_address=True)
            await site.start()
            server = site._server
            assert server is not None
            bound.append(int(server.sockets[0].getsockname()[1]))  # type: ignore[attr-defined]
        yield bound
    finally:
        await runner.cleanup()


class ProviderThread:
    """An aiohttp app served on 127.0.0.1 from a daemon thread with its own event loop (the demo's passes run
    their own loops in the main thread); `call` runs a function on that loop, where the app's state lives."""

    def __init__(self, app: web.Application) -> None:
        self.app = app
        self.loop = asyncio.new_event_loop()
        self.port = 0
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="simulated-provider", daemon=True)

    def start(self) -> str:
        self._thread.start()
        if not self._ready.wait(30) or not self.port:
            raise DemoError("the simulated provider did not start on 127.0.0.1 within 30 s")
        return f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._serve())

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        try:
            async with serve(self.app) as ports:
                self.port = ports[0]
                self._ready.set()
                await self._stop.wait()
        finally:
            self._ready.set()

    def call(self, function: Callable[[], Any], timeout_s: float = 10.0) -> Any:
        async def run() -> Any:
            return function()

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout_s)

    def stop(self) -> None:
        if self._stop is not None and self._thread.is_alive():
            self.loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(10)
