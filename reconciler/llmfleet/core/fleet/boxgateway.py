"""The box gateway's part of the box JSON: one public port with one bearer in front of every server.

On a box with `gateway: P` each server entry gets `"listen_host": "127.0.0.1"` (vLLM on loopback,
part of its digest) and the document gets a top-level `gateway`:

    {"port": P,                            the public listen port the gateway binds
     "api_key": "sk-vllm-...",             its client bearer, derived like a server's from (box, P)
     "models": {served name: server name}, which server each model name routes to
     "config": {...},                      the gateway's own config (LLMhop format), without secrets
     "digest": "sha256:..."}               of the above and the fingerprints of every bearer it uses

The config names its secrets as `${cred:client-token}` and `${cred:bearer-<server>}`: the installer
writes those files into the directory it gives the gateway's program as $CREDENTIALS_DIRECTORY, so
the config is the same whatever the box's data directory is, and holds no bearer.
"""

from __future__ import annotations

import hashlib

from llmfleet.core.fleet.bearer import bearer_fingerprint
from llmfleet.core.fleet.jsonvalue import JSON, canonical_json
from llmfleet_contract.boxjson import CLIENT_TOKEN_CREDENTIAL, bearer_credential

LOOPBACK = "127.0.0.1"
PUBLIC_HOST = "0.0.0.0"  # noqa: S104 - the gateway is what the provider's port map publishes
# Written out in every config so that a box never depends on the gateway's defaults. vLLM schedules
# and queues on its own, so the per-model slots are a safety valve well above a batch, not a throttle.
LIMITS: dict[str, JSON] = {
    "maxBodyBytes": 100 * 1024 * 1024,
    "maxConcurrentRequests": 512,
    "maxQueuedRequests": 64,
    "queueTimeoutSeconds": 30,
    "connectTimeoutSeconds": 5,  # loopback: a refused connect is immediate, a long wait means a hung server
}


def _reference(credential: str) -> str:
    return "${cred:" + credential + "}"


def gateway_config(port: int, servers: list[dict[str, JSON]]) -> dict[str, JSON]:
    """The gateway's config: each served name routed to its server on loopback with its bearer."""
    models: dict[str, JSON] = {}
    for server in servers:
        headers: dict[str, JSON] = {"Authorization": "Bearer " + _reference(bearer_credential(str(server["name"])))}
        models[str(server["served_model_name"])] = {"url": f"http://{LOOPBACK}:{server['port']}",
                                                    "headers": headers}
    return {"host": PUBLIC_HOST, "port": port, "authTokens": [_reference(CLIENT_TOKEN_CREDENTIAL)], **LIMITS,
            "models": models}


def gateway_section(port: int, api_key: str, servers: list[dict[str, JSON]]) -> dict[str, JSON]:
    """The box JSON's `gateway`, from the box's rendered server entries (bearers included)."""
    section: dict[str, JSON] = {
        "port": port,
        "api_key": api_key,
        "models": {str(s["served_model_name"]): s["name"] for s in servers},
        "config": gateway_config(port, servers),
    }
    # The gateway reads its bearers at start-up: a new bearer behind it must restart it, so their
    # fingerprints (never the bearers) enter the digest.
    boot = {k: v for k, v in section.items() if k != "api_key"}
    boot["api_key_fingerprint"] = bearer_fingerprint(api_key)
    boot["bearer_fingerprints"] = {str(s["name"]): bearer_fingerprint(str(s["api_key"])) for s in servers}
    section["digest"] = "sha256:" + hashlib.sha256(canonical_json(boot).encode()).hexdigest()
    return section
