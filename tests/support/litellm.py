"""A real LiteLLM proxy for tests: one that is already running (CI's .ci/run starts it with
../shared/litellm-offline), named by FLEETLLM_TEST_LITELLM_URL and FLEETLLM_TEST_LITELLM_MASTER_KEY.
Tests that need it are skipped, saying why, when those are not set."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

URL_ENV = "FLEETLLM_TEST_LITELLM_URL"
KEY_ENV = "FLEETLLM_TEST_LITELLM_MASTER_KEY"
SKIP_REASON = (f"no LiteLLM proxy: set {URL_ENV} and {KEY_ENV} (.ci/run starts one with "
               "../shared/litellm-offline/setup.sh)")


@dataclass(frozen=True)
class LitellmProxy:
    url: str
    master_key: str = field(repr=False)

    def call(self, method: str, path: str, body: Any = None, timeout: float = 30) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url.rstrip("/") + path, data=data, method=method, headers={
            "Authorization": f"Bearer {self.master_key}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            text = exc.read()
            try:
                return exc.code, json.loads(text)
            except ValueError:
                return exc.code, text.decode(errors="replace")

    def deployments(self) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        page = 1
        while True:
            status, body = self.call("GET", f"/v2/model/info?size=500&page={page}")
            assert status == 200, body
            rows.extend(body["data"])
            if page >= (body.get("total_pages") or 1):
                return rows
            page += 1

    def reset(self, prefixes: tuple[str, ...] = ("fleetllm:", "test-")) -> None:
        """Delete every DB deployment fleetllm manages or a test made (config-file models stay)."""
        for row in self.deployments():
            info = row.get("model_info") or {}
            ident = str(info.get("id", ""))
            if info.get("db_model") and (info.get("managed_by") == "fleetllm" or ident.startswith(prefixes)):
                self.call("POST", "/model/delete", {"id": ident})


def proxy_from_env() -> LitellmProxy | None:
    url, key = os.environ.get(URL_ENV), os.environ.get(KEY_ENV)
    if not url or not key:
        return None
    return LitellmProxy(url, key)
