"""llmao's box API as a client: GET /vllm/config for a box, as the box would ask (fleetllm import --check).

The fleet key goes out under fleetllm.adapters.outgoing's policy: https (http only to a loopback address),
no redirect followed, no proxy from the environment, an overall deadline, no key in a message."""

from __future__ import annotations

import json
from collections.abc import Mapping

from fleetllm.adapters.outgoing import OutgoingError, fetch, plain_http_problem
from fleetllm.core.fleet.jsonvalue import JSON
from fleetllm.core.importer.check import BoxSource


def fetched_source(url: str, fleet_key: str, timeout_s: float = 30.0) -> BoxSource:
    """llmao's own answer: GET <url>/vllm/config as the box would ask for it. ValueError for a URL the fleet
    key may not go to."""
    problem = plain_http_problem(url)
    if problem is not None:
        raise ValueError(f"{url!r}: {problem}")

    def source(box: str) -> Mapping[str, JSON] | str:
        try:
            answer = fetch("GET", url.rstrip("/") + "/vllm/config", what="GET /vllm/config", timeout_s=timeout_s,
                           headers={"Authorization": f"Bearer {fleet_key}", "Accept": "application/json",
                                    "X-LLMAO-Host": box}, secrets=(fleet_key,))
        except OutgoingError as exc:
            return f"GET /vllm/config failed: {exc}"
        if 300 <= answer.status < 400:
            return (f"llmao answered {answer.status} (a redirect) to GET /vllm/config: not followed, the fleet key "
                    "goes only to --llmao-url; give llmao's final URL")
        if answer.status != 200:
            return f"llmao answered {answer.status} to GET /vllm/config"
        try:
            body = json.loads(answer.body)
        except ValueError:
            return "llmao's answer is not JSON"
        if not isinstance(body, dict) or not isinstance(body.get("servers"), list):
            return "llmao's answer has no servers list"
        return body
    return source
