"""Error responses: LLMhop's status codes and messages, as OpenAI-style JSON bodies.

LLMhop answers errors in plain text (`unknown model "x"\\n`); LiteLLM and OpenAI clients parse
`{"error": {"message", "type", "param", "code"}}`, so the gateway sends that shape with LLMhop's
message text and the same status code (gateway/README.md, "Deviations").
"""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True)
class GatewayError:
    status: int
    message: str
    code: str
    type: str = "invalid_request_error"

    def body(self) -> bytes:
        payload = {"error": {"message": self.message, "type": self.type, "param": None, "code": self.code}}
        return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


UNAUTHORIZED = GatewayError(401, "unauthorized", "invalid_api_key", "authentication_error")
BODY_TOO_LARGE = GatewayError(413, "request body too large", "request_too_large")
BODY_UNREADABLE = GatewayError(400, "failed to read request body", "invalid_body")
INVALID_JSON = GatewayError(400, "invalid JSON request body", "invalid_json")
MISSING_MODEL = GatewayError(400, "missing model", "missing_model")
QUEUE_FULL = GatewayError(503, "too many concurrent requests", "too_many_concurrent_requests", "server_error")
BODIES_AT_LIMIT = GatewayError(503, "too many concurrent requests (request bodies in memory at maxBufferedBytes)",
                               "too_many_concurrent_requests", "server_error")
QUEUE_TIMEOUT = GatewayError(503, "too many concurrent requests (timed out waiting for a slot)",
                             "too_many_concurrent_requests", "server_error")


def unknown_model(name: str) -> GatewayError:
    # json.dumps quotes like Go's %q for every printable name.
    return GatewayError(404, f"unknown model {json.dumps(name, ensure_ascii=False)}", "model_not_found")


def upstream_failed(model: str, reason: str) -> GatewayError:
    """502: the upstream could not be reached or broke the exchange. `reason` never holds a secret."""
    return GatewayError(502, f"upstream of model {json.dumps(model, ensure_ascii=False)} failed: {reason}",
                        "upstream_error", "server_error")


def body_too_complex(limit: int) -> GatewayError:
    """413 for a body with more '[' and '{' than the gateway scans (gateway/llmfleet_gateway/jsonscan.py)."""
    return GatewayError(413, f"request body too large (more than {limit} '[' and '{{')", "request_too_large")
