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
from collections.abc import Sequence

from fleetllm.core.fleet.bearer import bearer_fingerprint
from fleetllm.core.fleet.jsonvalue import JSON, canonical_json
from fleetllm_contract.boxjson import CLIENT_TOKEN_CREDENTIAL, bearer_credential

LOOPBACK = "127.0.0.1"
PUBLIC_HOST = "0.0.0.0"  # noqa: S104 - the gateway is what the provider's port map publishes
# Written out in every config so that a box never depends on the gateway's defaults.
LIMITS: dict[str, JSON] = {
    "maxBodyBytes": 100 * 1024 * 1024,
    "queueTimeoutSeconds": 30,
    "connectTimeoutSeconds": 5,  # loopback: a refused connect is immediate, a long wait means a hung server
}
# Each model's slots are what its vLLM batches at once (continuous batching up to --max-num-seqs), so the
# gateway never answers 503 to a request vLLM would have taken into its running batch; as many again may
# wait in the gateway's queue (vLLM would have queued them itself). Without --max-num-seqs in the recipe,
# vLLM's own default for `vllm serve`: vLLM 0.32 (EngineArgs.get_batch_defaults, usage context
# OPENAI_API_SERVER) takes 1024 on a card of 160 GiB or more, or of 70 GiB or more but an A100 (H100, H200),
# 256 on other GPUs and 128 per CPU socket; the largest is used, as the box's card is not known here and
# admitting more than vLLM batches only moves the wait into vLLM's own queue (no 503 either way).
VLLM_DEFAULT_MAX_NUM_SEQS = 1024


def max_num_seqs(args: Sequence[JSON]) -> int | None:
    """The --max-num-seqs a server's vLLM argv sets (the last one wins, as in vLLM's parser), in any spelling vLLM
    reads: `--max-num-seqs N`, `--max_num_seqs N`, `--max-num-seqs=N`."""
    found: int | None = None
    tokens = [str(t) for t in args]
    for i, token in enumerate(tokens):
        name, eq, value = token.partition("=")
        if name.replace("_", "-") != "--max-num-seqs":
            continue
        raw = value if eq else (tokens[i + 1] if i + 1 < len(tokens) else "")
        if raw.isdigit() and int(raw) > 0:
            found = int(raw)
    return found


def model_limits(server: dict[str, JSON]) -> dict[str, JSON]:
    """The gateway's per-model slots and queue for one server, from what its vLLM accepts."""
    args = server.get("args")
    seqs = max_num_seqs(args if isinstance(args, list) else []) or VLLM_DEFAULT_MAX_NUM_SEQS
    return {"maxConcurrentRequests": seqs, "maxQueuedRequests": seqs}


def _reference(credential: str) -> str:
    return "${cred:" + credential + "}"


def gateway_config(port: int, servers: list[dict[str, JSON]]) -> dict[str, JSON]:
    """The gateway's config: each served name routed to its server on loopback with its bearer."""
    models: dict[str, JSON] = {}
    for server in servers:
        headers: dict[str, JSON] = {"Authorization": "Bearer " + _reference(bearer_credential(str(server["name"])))}
        models[str(server["served_model_name"])] = {"url": f"http://{LOOPBACK}:{server['port']}",
                                                    "headers": headers, **model_limits(server)}
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
