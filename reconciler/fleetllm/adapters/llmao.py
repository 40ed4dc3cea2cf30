"""llmao's box API as a client: GET /vllm/config for a box, as the box would ask (fleetllm import --check)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping

from fleetllm.core.fleet.jsonvalue import JSON
from fleetllm.core.importer.check import BoxSource


def fetched_source(url: str, fleet_key: str, timeout_s: float = 30.0) -> BoxSource:
    """llmao's own answer: GET <url>/vllm/config as the box would ask for it."""
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"{url!r} is not an http(s) URL")

    def source(box: str) -> Mapping[str, JSON] | str:
        request = urllib.request.Request(url.rstrip("/") + "/vllm/config", headers={  # noqa: S310 - http(s) checked
            "Authorization": f"Bearer {fleet_key}", "Accept": "application/json", "X-LLMAO-Host": box})
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310 - http(s) checked
                body = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return f"llmao answered {exc.code} to GET /vllm/config"
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            return f"GET /vllm/config failed: {reason}"
        if not isinstance(body, dict) or not isinstance(body.get("servers"), list):
            return "llmao's answer has no servers list"
        return body
    return source
