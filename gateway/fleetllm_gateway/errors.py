"""The gateway's errors: the exception tree, and the error responses (LLMhop's status codes and
messages, as OpenAI-style JSON bodies).

    GatewayError          every error the gateway raises on purpose (never the caller's bytes or bearer)
    ├── ConfigError       the config file is unusable (config.py; also a ValueError)
    ├── TargetError       a model's URL is unusable (target.py; also a ValueError)
    ├── ProxyError        the proxy environment is unusable (proxyenv.py; also a ValueError)
    ├── BindError         the listening socket cannot be had (serve.py)
    ├── BodyError         a body-routed request's body names no model: carries its ErrorResponse
    ├── IncompleteBodyError  a request body that cannot end: the client left or broke its framing
    │                     (raised by httpserver.py; also a ConnectionError)
    ├── NativeBuildError  a build of the compiled modules does not fit (native.py; caught there: the gateway
    │                     then runs its Python modules)
    ├── UpstreamError     the exchange with a model's server failed (connection.py)
    └── StaleError        a pooled connection was closed by the server before reuse (response.py)

LLMhop answers errors in plain text (`unknown model "x"\\n`); LiteLLM and OpenAI clients parse
`{"error": {"message", "type", "param", "code"}}`, so the gateway sends that shape with LLMhop's
message text and the same status code (gateway/README.md, "Deviations").
"""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True)
class ErrorResponse:
    status: int
    message: str
    code: str
    type: str = "invalid_request_error"

    def body(self) -> bytes:
        payload = {"error": {"message": self.message, "type": self.type, "param": None, "code": self.code}}
        return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


UNAUTHORIZED = ErrorResponse(401, "unauthorized", "invalid_api_key", "authentication_error")
BODY_TOO_LARGE = ErrorResponse(413, "request body too large", "request_too_large")
BODY_UNREADABLE = ErrorResponse(400, "failed to read request body", "invalid_body")
INVALID_JSON = ErrorResponse(400, "invalid JSON request body", "invalid_json")
MISSING_MODEL = ErrorResponse(400, "missing model", "missing_model")
INTERNAL_ERROR = ErrorResponse(500, "internal error of the gateway (logged)", "internal_error", "server_error")
QUEUE_FULL = ErrorResponse(503, "too many concurrent requests", "too_many_concurrent_requests", "server_error")
BODIES_AT_LIMIT = ErrorResponse(503, "too many concurrent requests (request bodies in memory at maxBufferedBytes)",
                               "too_many_concurrent_requests", "server_error")
QUEUE_TIMEOUT = ErrorResponse(503, "too many concurrent requests (timed out waiting for a slot)",
                             "too_many_concurrent_requests", "server_error")


def unknown_model(name: str) -> ErrorResponse:
    # json.dumps quotes like Go's %q for every printable name.
    return ErrorResponse(404, f"unknown model {json.dumps(name, ensure_ascii=False)}", "model_not_found")


def upstream_failed(model: str, reason: str) -> ErrorResponse:
    """502: the upstream could not be reached or broke the exchange. `reason` never holds a secret."""
    return ErrorResponse(502, f"upstream of model {json.dumps(model, ensure_ascii=False)} failed: {reason}",
                        "upstream_error", "server_error")


def body_too_complex(limit: int) -> ErrorResponse:
    """413 for a body with more '[' and '{' than the gateway scans (gateway/fleetllm_gateway/jsonscan.py)."""
    return ErrorResponse(413, f"request body too large (more than {limit} '[' and '{{')", "request_too_large")


class GatewayError(Exception):
    """The root of the gateway's errors."""


class BodyError(GatewayError):
    """The body of a body-routed request does not name a model."""

    def __init__(self, error: ErrorResponse) -> None:
        super().__init__(error.message)
        self.error = error


class IncompleteBodyError(GatewayError, ConnectionError):
    """The request body ended before its end (the client left) or broke its framing (httpserver.py).
    Defined here, not in httpserver.py: a class that inherits a built-in exception other than Exception
    cannot be compiled (fleetllm_gateway.native), and this module never is."""
