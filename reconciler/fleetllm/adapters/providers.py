"""Provider listings: which boxes a provider runs, and the public port of each listen port.

- Vast (`GET /api/v1/instances/`, keyset paging with `next_token`): a box is named by its public IP;
  `ports` maps `"8001/tcp"` to `[{"HostIp", "HostPort"}]` (a string) and exists only while running.
  Several instances may share one IP: the one whose `label` is the box name wins, otherwise the box is
  ambiguous (Unknown, never guessed).
- RunPod: a box is named by its pod id. REST API v2 (`GET https://api.runpod.io/v2/pods`, in beta):
  `{"pods": [...]}`, `runtime` is null unless RUNNING and `runtime.ports` lists
  `{"private", "public", "type", "ip"}`, possibly late and with nulls. Where v2 answers 404 or 403 (an
  account without the beta), REST API v1 (`GET https://rest.runpod.io/v1/pods`): a list of pods with
  `desiredStatus`, `publicIp` (null while initialising) and `portMappings` `{"8001": 40123}` (TCP
  ports only). Both shapes are those of RunPod's published OpenAPI documents (schemas/providers/).
- The price of each box, USD per hour, is read from the same listing: Vast `dph_total` (with `gpu_name`,
  `num_gpus`), RunPod v2 `cost` and v1 `costPerHr` (with `gpu`: `id` or v1's `displayName`, `count`).
  A price missing or not a number leaves the box unpriced (`fleetllm.core.cost`), never 0.
- A capacity pool's rental (labelled `fleetllm-POOL-N`: RunPod's pod name, Vast's instance label) is listed
  under its label too: it is rented with LLMAO_HOST set to the label, so it presents itself under it and the
  placement places it so, in the commit that declares its pool (issue 25); the listing says which pod or
  instance, and where, that name is.
- Static boxes are not listed: public port = listen port (see `observed.resolve_endpoint`).

A listing that fails, or answers something we cannot read, is a failed observation: the planner then
deletes nothing.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Protocol

import aiohttp

from fleetllm.adapters.http import HttpError, RetryPolicy, request_json
from fleetllm.core.capacity import LABEL_PREFIX, Offer, RentRequest
from fleetllm.core.fleet.jsonvalue import JSON
from fleetllm.core.fleet.model import Pool, Provider
from fleetllm.core.judge.intended import Endpoint
from fleetllm.core.judge.observed import ProviderBox, ProviderListing
from fleetllm.core.secret import Secret
from fleetllm.errors import UpstreamError

VAST_URL = "https://console.vast.ai"
RUNPOD_URL = "https://api.runpod.io"  # REST API v2
RUNPOD_V1_URL = "https://rest.runpod.io/v1"  # REST API v1
RUNPOD_V2_MISSING = frozenset({403, 404})  # v2 not offered to this account: ask v1
VAST_PAGE = 25  # the API's maximum
MAX_PAGES = 2000  # a loop guard against a paging bug on either side
RENTAL_PREFIX = LABEL_PREFIX  # a capacity pool's rentals are labelled fleetllm-POOL-N (fleetllm.core.capacity)
VAST_TERMINAL = frozenset({"exited", "unknown", "offline"})


class ListingError(UpstreamError):
    """A provider's listing answered but cannot be used (shape, paging)."""


class ProviderClient(Protocol):
    provider: Provider

    async def list(self, session: aiohttp.ClientSession) -> ProviderListing: ...


@dataclass(frozen=True)
class ProviderAccess:
    api_key: Secret  # revealed only into the Authorization header
    url: str
    timeout_s: float = 30.0
    retry: RetryPolicy = field(default_factory=lambda: RetryPolicy(attempts=4))

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key.reveal()}", "Accept": "application/json"}


def _vast_endpoints(host: str, ports: JSON) -> dict[int, Endpoint]:
    endpoints: dict[int, Endpoint] = {}
    if not isinstance(ports, dict):
        return endpoints
    for spec, bindings in ports.items():
        number, _, proto = spec.partition("/")
        if proto != "tcp" or not number.isdigit() or not isinstance(bindings, list):
            continue
        candidates = [b for b in bindings if isinstance(b, dict) and str(b.get("HostPort") or "").isdigit()]
        candidates.sort(key=lambda b: b.get("HostIp") != "0.0.0.0")  # noqa: S104 (reading Docker's binding)
        if candidates:
            endpoints[int(number)] = Endpoint(host, int(str(candidates[0]["HostPort"])))
    return endpoints


def vast_boxes(instances: list[JSON]) -> dict[str, ProviderBox]:
    """Pure: Vast instances -> boxes keyed by public IP."""
    by_ip: dict[str, list[dict[str, JSON]]] = {}
    for item in instances:
        if isinstance(item, dict) and isinstance(ip := item.get("public_ipaddr"), str) and ip.strip():
            by_ip.setdefault(ip.strip(), []).append(item)
    boxes: dict[str, ProviderBox] = {}
    for ip, group in by_ip.items():
        if len(group) > 1:
            labelled = [i for i in group if i.get("label") == ip]
            live = [i for i in group if i.get("actual_status") not in VAST_TERMINAL]
            group = labelled or live or group
        if len(group) > 1:
            ids = ", ".join(str(i.get("id")) for i in group)
            boxes[ip] = ProviderBox(ip, ambiguous=f"Vast instances {ids} share the IP {ip}; label the right one "
                                                  f"{ip!r} (PUT /api/v0/instances/ID/ label)")
            continue
        item = group[0]
        status = str(item.get("actual_status") or "provisioning")
        endpoints = _vast_endpoints(ip, item.get("ports")) if status == "running" else {}
        boxes[ip] = _vast_box(ip, item, endpoints)
    return boxes


def _vast_box(name: str, item: Mapping[str, JSON], endpoints: dict[int, Endpoint]) -> ProviderBox:
    gpu, gpus = _gpu(item, "gpu_name", "num_gpus")
    label = item.get("label")
    return ProviderBox(name, endpoints, status=str(item.get("actual_status") or "provisioning"),
                       ident=f"instance {item.get('id')}", price=_price(item.get("dph_total")), gpu=gpu, gpus=gpus,
                       label=label if isinstance(label, str) else "")


def vast_rentals(instances: list[JSON]) -> dict[str, ProviderBox]:
    """Pure: the instances labelled as a capacity pool's rental (`fleetllm-...`), by instance id; the box is named
    by its public IP, "" while it has none."""
    out: dict[str, ProviderBox] = {}
    for item in instances:
        if (isinstance(item, dict) and isinstance(label := item.get("label"), str) and label.startswith(RENTAL_PREFIX)
                and isinstance(ident := item.get("id"), int)):
            ip = item.get("public_ipaddr")
            out[str(ident)] = _vast_box(ip.strip() if isinstance(ip, str) else "", item, {})
    return out


def vast_labelled(instances: list[JSON]) -> dict[str, ProviderBox]:
    """Pure: each instance labelled as a capacity pool's rental, named by its label (`fleetllm-POOL-N`): the name
    it presents itself under (the rental's LLMAO_HOST) and the placement places it by; its endpoints while
    it runs and has a public IP."""
    out: dict[str, ProviderBox] = {}
    for item in instances:
        if not (isinstance(item, dict) and isinstance(label := item.get("label"), str)
                and label.startswith(RENTAL_PREFIX)):
            continue
        ip = item.get("public_ipaddr")
        running = item.get("actual_status") == "running" and isinstance(ip, str) and ip.strip()
        endpoints = _vast_endpoints(ip.strip(), item.get("ports")) if running and isinstance(ip, str) else {}
        out[label] = _vast_box(label, item, endpoints)
    return out


def by_label(boxes: Mapping[str, ProviderBox]) -> dict[str, ProviderBox]:
    """Each box labelled as a capacity pool's rental also under its label (its name in the fleet), unless a box
    of that name is listed already."""
    labelled = {box.label: replace(box, box=box.label) for box in boxes.values()
                if box.label.startswith(RENTAL_PREFIX) and box.label not in boxes}
    return {**boxes, **labelled}


def _price(value: JSON) -> float | None:
    """A listed $/h: a non-negative number (RunPod's v1 document gives a string as its example; read both)."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        price = float(value) if isinstance(value, (int, float, str)) else -1.0
    except ValueError:
        return None
    return price if price >= 0 and price == price and price != float("inf") else None


def _count(value: JSON) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _gpu(item: Mapping[str, JSON], name_key: str, count_key: str) -> tuple[str, int | None]:
    name = item.get(name_key)
    return (name.strip() if isinstance(name, str) else ""), _count(item.get(count_key))


def _public_first(entry: Mapping[str, JSON]) -> bool:
    try:
        return ipaddress.ip_address(str(entry.get("ip"))).is_private
    except ValueError:
        return True


def runpod_boxes(pods: list[JSON]) -> dict[str, ProviderBox]:
    """Pure: RunPod v2 pods -> boxes keyed by pod id."""
    boxes: dict[str, ProviderBox] = {}
    for pod in pods:
        if not isinstance(pod, dict) or not isinstance(pod_id := pod.get("id"), str):
            continue
        status = str(pod.get("status") or pod.get("desiredStatus") or "UNKNOWN")
        runtime = pod.get("runtime")
        ports = runtime.get("ports") if isinstance(runtime, dict) else None
        entries = [p for p in ports if isinstance(p, dict)] if isinstance(ports, list) else []
        entries.sort(key=_public_first)
        endpoints: dict[int, Endpoint] = {}
        for p in entries:
            private, public, ip = p.get("private"), p.get("public"), p.get("ip")
            if (p.get("type") == "tcp" and isinstance(private, int) and isinstance(public, int)
                    and isinstance(ip, str) and ip and private not in endpoints):
                endpoints[private] = Endpoint(ip, public)
        gpu_config = pod.get("gpu")
        gpu, gpus = _gpu(gpu_config, "id", "count") if isinstance(gpu_config, dict) else ("", None)
        name = pod.get("name")
        boxes[pod_id] = ProviderBox(pod_id, endpoints, status=status.lower(), ident=f"pod {pod_id}",
                                    price=_price(pod.get("cost")), gpu=gpu.removeprefix("NVIDIA "), gpus=gpus,
                                    label=name if isinstance(name, str) else "")
    return boxes


def runpod_rentals(boxes: Mapping[str, ProviderBox]) -> dict[str, ProviderBox]:
    """The pods named as a capacity pool's rental (`fleetllm-...`), by pod id (a pod's id is its box name)."""
    return {pod_id: box for pod_id, box in boxes.items() if box.label.startswith(RENTAL_PREFIX)}


def runpod_v1_boxes(pods: list[JSON]) -> dict[str, ProviderBox]:
    """Pure: RunPod REST v1 pods -> boxes keyed by pod id."""
    boxes: dict[str, ProviderBox] = {}
    for pod in pods:
        if not isinstance(pod, dict) or not isinstance(pod_id := pod.get("id"), str):
            continue
        status = str(pod.get("desiredStatus") or "UNKNOWN")
        ip, mappings = pod.get("publicIp"), pod.get("portMappings")
        endpoints: dict[int, Endpoint] = {}
        if isinstance(ip, str) and ip and isinstance(mappings, dict):
            for private, public in mappings.items():
                if str(private).isdigit() and isinstance(public, int) and not isinstance(public, bool):
                    endpoints[int(private)] = Endpoint(ip, public)
        gpu_config = pod.get("gpu")
        gpu, gpus = ("", None)
        if isinstance(gpu_config, dict):
            gpu, gpus = _gpu(gpu_config, "displayName", "count")
            gpu = gpu or _gpu(gpu_config, "id", "count")[0].removeprefix("NVIDIA ")
        name = pod.get("name")
        boxes[pod_id] = ProviderBox(pod_id, endpoints, status=status.lower(), ident=f"pod {pod_id}",
                                    price=_price(pod.get("costPerHr")), gpu=gpu, gpus=gpus,
                                    label=name if isinstance(name, str) else "")
    return boxes


def runpod_v1_url(url: str) -> str:
    """REST v1's base beside a configured v2 base: RunPod's own, or `URL/v1` on any other (a proxy, a fake)."""
    return RUNPOD_V1_URL if url.rstrip("/") == RUNPOD_URL else url.rstrip("/") + "/v1"


class VastClient:
    provider = Provider.VAST

    def __init__(self, access: ProviderAccess) -> None:
        self.access = access

    async def list(self, session: aiohttp.ClientSession) -> ProviderListing:
        instances: list[JSON] = []
        token: str | None = None
        try:
            for _ in range(MAX_PAGES):
                params = {"limit": str(VAST_PAGE)}
                if token:
                    params["after_token"] = token
                _, body = await request_json(session, "GET", f"{self.access.url.rstrip('/')}/api/v1/instances/",
                                             what="Vast GET /api/v1/instances/", headers=self.access.headers(),
                                             params=params, timeout_s=self.access.timeout_s, retry=self.access.retry)
                if not isinstance(body, dict) or not isinstance(page := body.get("instances"), list):
                    raise ListingError("Vast GET /api/v1/instances/: the answer has no `instances` list")
                instances.extend(page)
                next_token = body.get("next_token")
                if not next_token:
                    boxes = {**vast_labelled(instances), **vast_boxes(instances)}
                    return ProviderListing(Provider.VAST, boxes, rentals=vast_rentals(instances))
                if not isinstance(next_token, str) or next_token == token:
                    raise ListingError("Vast GET /api/v1/instances/: bad next_token (paging does not advance)")
                token = next_token
            raise ListingError(f"Vast GET /api/v1/instances/: more than {MAX_PAGES} pages")
        except (HttpError, ListingError) as exc:
            return ProviderListing(Provider.VAST, error=str(exc))


class RunPodClient:
    provider = Provider.RUNPOD

    def __init__(self, access: ProviderAccess) -> None:
        self.access = access

    async def list(self, session: aiohttp.ClientSession) -> ProviderListing:
        try:
            _, body = await request_json(session, "GET", f"{self.access.url.rstrip('/')}/v2/pods",
                                         what="RunPod GET /v2/pods", headers=self.access.headers(),
                                         timeout_s=self.access.timeout_s, retry=self.access.retry)
        except HttpError as exc:
            if exc.status not in RUNPOD_V2_MISSING:
                return ProviderListing(Provider.RUNPOD, error=str(exc))
            return await self.list_v1(session, f"v2 answered {exc.status}")
        if not isinstance(body, dict) or not isinstance(pods := body.get("pods"), list):
            return ProviderListing(Provider.RUNPOD, error="RunPod GET /v2/pods: the answer has no `pods` list")
        boxes = runpod_boxes(pods)
        return ProviderListing(Provider.RUNPOD, by_label(boxes), rentals=runpod_rentals(boxes))

    async def list_v1(self, session: aiohttp.ClientSession, why: str) -> ProviderListing:
        what = f"RunPod GET /v1/pods ({why})"
        try:
            _, body = await request_json(session, "GET", f"{runpod_v1_url(self.access.url)}/pods", what=what,
                                         headers=self.access.headers(), timeout_s=self.access.timeout_s,
                                         retry=self.access.retry)
        except HttpError as exc:
            return ProviderListing(Provider.RUNPOD, error=str(exc))
        if not isinstance(body, list):
            return ProviderListing(Provider.RUNPOD, error=f"{what}: the answer is not a list of pods")
        boxes = runpod_v1_boxes(body)
        return ProviderListing(Provider.RUNPOD, by_label(boxes), rentals=runpod_rentals(boxes))


# Renting and terminating (fleetllm.core.capacity plans them). A create is never retried within a call: a
# timeout may have rented all the same, and the next pass sees the rental in the listing by its label
# (fleetllm-POOL-N) and does not rent it again. Terminations retry (deleting twice is harmless). A rental's
# environment sets LLMAO_HOST to its label (RunPod `env`; Vast `env`, Docker flags merged into the template's):
# the provisioning scripts present the box under that name rather than its pod id or public IP.

HOST_VARIABLE = "LLMAO_HOST"  # a rental's environment names the box by its label: vast.sh and runpod.sh present it


class RentalError(UpstreamError):
    """A provider refused or failed a rental, a termination or an offer search (the message says which)."""


@dataclass(frozen=True)
class Rented:
    """What a rental call answered: the provider's id of the new box, its name (its label: the rental's
    environment sets LLMAO_HOST to it, so the box presents itself so and the placement places it so) and the
    price it bills, when the answer says."""

    ident: str
    box: str | None
    per_hour: float | None


def _number(value: JSON) -> float | None:
    return _price(value) if not isinstance(value, str) else None


def vast_offers(body: JSON, pool: Pool) -> list[Offer]:
    """Pure: Vast's offer search answer (`{"offers": [...]}`) -> offers for the pool."""
    found = body.get("offers") if isinstance(body, dict) else None
    if not isinstance(found, list):
        raise RentalError("Vast POST /api/v0/bundles/: the answer has no `offers` list")
    offers = []
    for item in found:
        if not isinstance(item, dict) or not isinstance(ident := item.get("id"), int):
            continue
        price, gpus = _number(item.get("dph_total")), _count(item.get("num_gpus"))
        if price is None or gpus is None:
            continue
        region = item.get("geolocation")
        offers.append(Offer(Provider.VAST, str(ident), str(item.get("gpu_name") or pool.gpu), gpus, price,
                            region.rsplit(",", 1)[-1].strip() if isinstance(region, str) else ""))
    return offers


def runpod_offers(body: JSON, pool: Pool) -> list[Offer]:
    """Pure: RunPod's GPU catalog (`GET /v2/catalog/gpus`: `{"gpus": [GpuType]}`, `price.secure` per GPU) ->
    the pool's GPU type at its secure-cloud list price times the pool's GPU count."""
    found = body.get("gpus") if isinstance(body, dict) else None
    if not isinstance(found, list):
        raise RentalError("RunPod GET /v2/catalog/gpus: the answer has no `gpus` list")
    offers = []
    for item in found:
        if not isinstance(item, dict) or item.get("id") != pool.gpu or item.get("secure") is not True:
            continue
        prices = item.get("price")
        each = _number(prices.get("secure")) if isinstance(prices, dict) else None
        if each is not None:
            offers.append(Offer(Provider.RUNPOD, pool.gpu, str(item.get("name") or pool.gpu), pool.gpus,
                                round(each * pool.gpus, 4)))
    return offers


class VastRenter:
    """Vast: search offers (`POST /api/v0/bundles/`), accept an ask (`PUT /api/v0/asks/{id}/`), destroy an
    instance (`DELETE /api/v0/instances/{id}/`); paths with the trailing slash as Vast's own CLI sends them."""

    provider = Provider.VAST

    def __init__(self, access: ProviderAccess) -> None:
        self.access = access

    def _url(self, path: str) -> str:
        return f"{self.access.url.rstrip('/')}{path}"

    async def offers(self, session: aiohttp.ClientSession, pool: Pool) -> list[Offer]:
        query: dict[str, JSON] = {"limit": 20, "type": "ondemand", "verified": {"eq": True},
                                  "rentable": {"eq": True}, "rented": {"eq": False}, "gpu_name": {"in": [pool.gpu]},
                                  "num_gpus": {"in": [pool.gpus]}, "dph_total": {"lte": pool.max_per_hour}}
        if pool.regions:
            query["geolocation"] = {"in": list(pool.regions)}
        try:
            _, body = await request_json(session, "POST", self._url("/api/v0/bundles/"),
                                         what="Vast POST /api/v0/bundles/", headers=self.access.headers(),
                                         body=query, timeout_s=self.access.timeout_s, retry=self.access.retry)
        except HttpError as exc:
            raise RentalError(str(exc)) from None
        return vast_offers(body, pool)

    async def rent(self, session: aiohttp.ClientSession, request: RentRequest) -> Rented:
        body: dict[str, JSON] = {"image": request.image or "", "label": request.label, "target_state": "running",
                                 "cancel_unavail": True, "env": f"-e {HOST_VARIABLE}={request.label}"}
        if request.template:
            body["template_hash_id"] = request.template
        if request.disk_gb:
            body["disk"] = float(request.disk_gb)
        what = f"Vast PUT /api/v0/asks/{request.ask}/ ({request.label})"
        try:
            _, answer = await request_json(session, "PUT", self._url(f"/api/v0/asks/{request.ask}/"), what=what,
                                           headers=self.access.headers(), body=body, timeout_s=self.access.timeout_s)
        except HttpError as exc:
            raise RentalError(str(exc)) from None
        contract = answer.get("new_contract") if isinstance(answer, dict) else None
        if not isinstance(contract, int) or isinstance(contract, bool):
            raise RentalError(f"{what}: the answer has no new_contract")
        return Rented(str(contract), request.label, None)

    async def terminate(self, session: aiohttp.ClientSession, ident: str) -> None:
        what = f"Vast DELETE /api/v0/instances/{ident}/"
        try:
            await request_json(session, "DELETE", self._url(f"/api/v0/instances/{ident}/"), what=what,
                               headers=self.access.headers(), timeout_s=self.access.timeout_s, retry=self.access.retry)
        except HttpError as exc:
            if exc.status != 404:  # already gone: what we wanted
                raise RentalError(str(exc)) from None


class RunPodRenter:
    """RunPod: the GPU catalog's list price (`GET /v2/catalog/gpus`), create a pod (`POST /v2/pods`, or REST v1
    `POST /pods` where v2 answers 404 or 403, as the listing falls back), terminate it (`DELETE .../pods/{id}`)."""

    provider = Provider.RUNPOD

    def __init__(self, access: ProviderAccess) -> None:
        self.access = access

    async def offers(self, session: aiohttp.ClientSession, pool: Pool) -> list[Offer]:
        try:
            _, body = await request_json(session, "GET", f"{self.access.url.rstrip('/')}/v2/catalog/gpus",
                                         what="RunPod GET /v2/catalog/gpus", headers=self.access.headers(),
                                         params={"gpuCount": str(pool.gpus)}, timeout_s=self.access.timeout_s,
                                         retry=self.access.retry)
        except HttpError as exc:
            raise RentalError(str(exc)) from None
        return runpod_offers(body, pool)

    async def rent(self, session: aiohttp.ClientSession, request: RentRequest) -> Rented:
        env: dict[str, JSON] = {HOST_VARIABLE: request.label}
        v2: dict[str, JSON] = {"name": request.label, "gpu": {"id": request.ask, "count": request.gpus}, "env": env}
        v1: dict[str, JSON] = {"name": request.label, "gpuTypeIds": [request.ask], "gpuCount": request.gpus,
                               "cloudType": "SECURE", "env": env}
        if request.image:
            v2["image"] = v1["imageName"] = request.image
        if request.template:
            v2["templateId"] = v1["templateId"] = request.template
        if request.regions:
            v2["dataCenterIds"] = v1["dataCenterIds"] = list(request.regions)
        if request.disk_gb:
            v2["disk"] = v1["containerDiskInGb"] = request.disk_gb
        what = f"RunPod POST /v2/pods ({request.label})"
        try:
            _, pod = await request_json(session, "POST", f"{self.access.url.rstrip('/')}/v2/pods", what=what,
                                        headers=self.access.headers(), body=v2, timeout_s=self.access.timeout_s,
                                        ok=frozenset({200, 201}))
            price_key = "cost"
        except HttpError as exc:
            if exc.status not in RUNPOD_V2_MISSING:
                raise RentalError(str(exc)) from None
            what = f"RunPod POST /v1/pods ({request.label}; v2 answered {exc.status})"
            try:
                _, pod = await request_json(session, "POST", f"{runpod_v1_url(self.access.url)}/pods", what=what,
                                            headers=self.access.headers(), body=v1, timeout_s=self.access.timeout_s,
                                            ok=frozenset({200, 201}))
            except HttpError as exc1:
                raise RentalError(str(exc1)) from None
            price_key = "costPerHr"
        if not isinstance(pod, dict) or not isinstance(pod_id := pod.get("id"), str) or not pod_id:
            raise RentalError(f"{what}: the answer has no pod id")
        return Rented(pod_id, request.label, _price(pod.get(price_key)))

    async def terminate(self, session: aiohttp.ClientSession, ident: str) -> None:
        """v2 first; where it answers 404 or 403 (no beta, or no such pod there), v1. A pod v1 does not know either
        (404) is gone already: what we wanted."""
        try:
            await request_json(session, "DELETE", f"{self.access.url.rstrip('/')}/v2/pods/{ident}",
                               what=f"RunPod DELETE /v2/pods/{ident}", headers=self.access.headers(),
                               timeout_s=self.access.timeout_s, retry=self.access.retry, ok=frozenset({200, 204}))
            return
        except HttpError as exc:
            if exc.status not in RUNPOD_V2_MISSING:
                raise RentalError(str(exc)) from None
        try:
            await request_json(session, "DELETE", f"{runpod_v1_url(self.access.url)}/pods/{ident}",
                               what=f"RunPod DELETE /v1/pods/{ident}", headers=self.access.headers(),
                               timeout_s=self.access.timeout_s, retry=self.access.retry, ok=frozenset({200, 204}))
        except HttpError as exc1:
            if exc1.status != 404:
                raise RentalError(str(exc1)) from None
