"""Probing one server: `GET /health` without a key, then `GET /v1/models` with its bearer.

Behind a box gateway the same two requests go through the gateway's path routing,
`/route/<served name>/health` and `/route/<served name>/v1/models`, with the gateway's bearer: the
gateway answers its own /v1/models from its config, so only a routed request says that the vLLM
behind it serves, and with the bearer the gateway holds for it. A 502/503/504 from the gateway is its
upstream not answering (loading or down); a 404 is a gateway that does not route the model yet. A
routed probe that passes also reads the gateway's own unauthenticated `/health` model count, which the
judge compares with the placement (a gateway routing another number of models runs an older config).

vLLM binds its port only once loaded, so while loading a connect is refused (or, through provider NAT,
reset or silent): all of those are failed probes, never "bad key". A passing /health says something
answers; only /v1/models with our bearer listing our served name says it is ours. Failures on our own
side (name resolution) are ERROR, which the judge reads as Unknown.
"""

from __future__ import annotations

import asyncio
import dataclasses
from urllib.parse import quote

import aiohttp
from yarl import URL

from fleetllm.core.fleet.jsonvalue import JSON
from fleetllm.core.judge.intended import Endpoint
from fleetllm.core.judge.observed import ProbeResult, ProbeStatus


def _classify(exc: BaseException, what: str, timeout_s: float) -> ProbeResult:
    if isinstance(exc, TimeoutError):
        return ProbeResult(ProbeStatus.TIMEOUT, f"{what}: no answer within {timeout_s:g}s")
    dns_error = getattr(aiohttp, "ClientConnectorDNSError", None)
    if dns_error is not None and isinstance(exc, dns_error):
        return ProbeResult(ProbeStatus.ERROR, f"{what}: cannot resolve the host ({exc.os_error})")
    if isinstance(exc, aiohttp.ClientConnectorError):
        reason = exc.os_error.strerror or type(exc.os_error).__name__
        return ProbeResult(ProbeStatus.REFUSED, f"{what}: {reason.lower()}")
    if isinstance(exc, (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, aiohttp.ClientPayloadError)):
        return ProbeResult(ProbeStatus.REFUSED, f"{what}: connection reset or closed")
    if isinstance(exc, aiohttp.ClientError):
        return ProbeResult(ProbeStatus.BAD_REPLY, f"{what}: {type(exc).__name__}")
    return ProbeResult(ProbeStatus.ERROR, f"{what}: {type(exc).__name__}")


def read_models(body: JSON, served_name: str) -> ProbeResult:
    """Pure: a /v1/models body -> the probe result for `served_name`."""
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list):
        return ProbeResult(ProbeStatus.BAD_REPLY, "GET /v1/models: not a model list")
    cards = [c for c in data if isinstance(c, dict) and isinstance(c.get("id"), str)]
    names = tuple(str(c["id"]) for c in cards)
    for card in cards:
        if card["id"] == served_name:
            length, root = card.get("max_model_len"), card.get("root")
            return ProbeResult(ProbeStatus.OK, f"lists {served_name}", names,
                               length if isinstance(length, int) and not isinstance(length, bool) else None,
                               root if isinstance(root, str) else None)
    listed = ", ".join(names[:5]) or "nothing"
    return ProbeResult(ProbeStatus.WRONG_MODEL, f"GET /v1/models lists {listed}, not {served_name}", names)


def _gateway_health(status: int, served_name: str) -> ProbeResult:
    if status in (401, 403):
        return ProbeResult(ProbeStatus.UNAUTHORIZED, f"the box gateway rejects our bearer (HTTP {status})")
    if status in (502, 503, 504):
        return ProbeResult(ProbeStatus.REFUSED, f"the box gateway cannot reach {served_name} (HTTP {status})")
    if status == 404:
        return ProbeResult(ProbeStatus.UNHEALTHY, f"the box gateway does not route {served_name} yet")
    return ProbeResult(ProbeStatus.UNHEALTHY, f"GET /health through the box gateway answered {status}")


async def probe(session: aiohttp.ClientSession, endpoint: Endpoint, bearer: str, served_name: str,
                timeout_s: float, *, via_gateway: bool = False) -> ProbeResult:
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    prefix = "/route/" + quote(served_name, safe="") if via_gateway else ""
    headers = {"Authorization": f"Bearer {bearer}"}
    what = "GET /health"
    try:
        async with session.get(URL(endpoint.url(prefix + "/health"), encoded=True), timeout=timeout,
                               headers=headers if via_gateway else None, allow_redirects=False) as response:
            await response.read()
            if response.status != 200:
                if via_gateway:
                    return _gateway_health(response.status, served_name)
                return ProbeResult(ProbeStatus.UNHEALTHY, f"GET /health answered {response.status}")
        what = "GET /v1/models"
        async with session.get(URL(endpoint.url(prefix + "/v1/models"), encoded=True), headers=headers,
                               timeout=timeout, allow_redirects=False) as response:
            if response.status in (401, 403):
                return ProbeResult(ProbeStatus.UNAUTHORIZED, f"GET /v1/models rejects our bearer "
                                                             f"(HTTP {response.status})")
            if response.status != 200:
                return ProbeResult(ProbeStatus.BAD_REPLY, f"GET /v1/models answered {response.status}")
            try:
                body = await response.json(content_type=None)
            except ValueError:
                return ProbeResult(ProbeStatus.BAD_REPLY, "GET /v1/models: not JSON")
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        return _classify(exc, what, timeout_s)
    except asyncio.CancelledError:
        raise
    result = read_models(body, served_name)
    if via_gateway and result.status is ProbeStatus.OK:
        result = dataclasses.replace(result, gateway_models=await _gateway_model_count(session, endpoint, timeout))
    return result


def read_gateway_health(body: JSON) -> int | None:
    """Pure: the box gateway's own `/health` body (`{"status": "ok", "models": N}`) -> N."""
    models = body.get("models") if isinstance(body, dict) else None
    return models if isinstance(models, int) and not isinstance(models, bool) and models >= 0 else None


async def _gateway_model_count(session: aiohttp.ClientSession, endpoint: Endpoint,
                               timeout: aiohttp.ClientTimeout) -> int | None:
    """How many models the box gateway routes, from its unauthenticated `/health`: a count that differs
    from the placement's says the gateway runs an older config. None when it cannot be read (the routed
    probe already said the server serves; this is only a second opinion)."""
    try:
        async with session.get(URL(endpoint.url("/health"), encoded=True), timeout=timeout,
                               allow_redirects=False) as response:
            if response.status != 200:
                return None
            return read_gateway_health(await response.json(content_type=None))
    except (TimeoutError, aiohttp.ClientError, OSError, ValueError):
        return None


GATEWAY_IN_FLIGHT = ("fleetllm_gateway_requests_in_flight", "fleetllm_gateway_requests_queued")
VLLM_IN_FLIGHT = ("vllm:num_requests_running", "vllm:num_requests_waiting")


def read_in_flight(text: str, served_name: str, *, via_gateway: bool) -> int | None:
    """Pure: Prometheus text -> the requests in flight and queued for `served_name`; None when the text
    has no such sample. The box gateway labels its samples model="<name>" (requests holding a slot,
    requests waiting for one); vLLM model_name="<name>" (running, waiting)."""
    names, label = (GATEWAY_IN_FLIGHT, "model") if via_gateway else (VLLM_IN_FLIGHT, "model_name")
    wanted = f'{label}="{served_name}"'
    total: float | None = None
    for line in text.splitlines():
        metric, _, rest = line.partition("{")
        if metric not in names or "}" not in rest:
            continue
        labels, _, value = rest.partition("}")
        if wanted not in labels.split(","):
            continue
        try:
            total = (total or 0.0) + float(value.split()[0])
        except (ValueError, IndexError):
            return None
    return None if total is None else max(0, round(total))


async def in_flight(session: aiohttp.ClientSession, endpoint: Endpoint, bearer: str, served_name: str,
                    timeout_s: float, *, via_gateway: bool = False) -> int | None:
    """The requests a server has in flight or queued, from the box gateway's /metrics (with its bearer)
    or vLLM's own; None when they cannot be read (a rollout's drain then waits its whole drain_s)."""
    try:
        async with session.get(URL(endpoint.url("/metrics"), encoded=True),
                               headers={"Authorization": f"Bearer {bearer}"},
                               timeout=aiohttp.ClientTimeout(total=timeout_s), allow_redirects=False) as response:
            if response.status != 200:
                return None
            return read_in_flight(await response.text(), served_name, via_gateway=via_gateway)
    except (TimeoutError, aiohttp.ClientError, OSError, UnicodeDecodeError):
        return None
