"""Malformed HTTP (the gateway's HTTP server, llhttp, refuses it before the handler runs) gets a 400 naming the kind of
error, and one log line: never the bytes the client sent (they hold its bearer), never a traceback.
issue 16, finding 7: an LF-only request was answered and logged with its raw bytes, Authorization
included. The header deadline's AttributeError traceback is covered by tests/faults/test_gateway_faults.py."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.gateway.conftest import GatewayProcess, Upstreams, reference_config, running_gateway

SECRET = "malformed-requests-bearer-4f1c9a"
AUTH = b"Authorization: Bearer " + SECRET.encode() + b"\r\n"

MALFORMED = {
    "lf-only": b"POST /v1/chat/completions HTTP/1.1\nHost: t\nAuthorization: Bearer " + SECRET.encode()
               + b"\nContent-Length: 16\n\n" + b'{"model":"echo"}',
    "header-line-too-long": b"GET /v1/models HTTP/1.1\r\nHost: t\r\n" + AUTH + b"X-Big: " + b"a" * 9000 + b"\r\n\r\n",
    "request-line-too-long": b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: t\r\n" + AUTH + b"\r\n",
    "bad-chunk-size": b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\n" + AUTH
                      + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n" + SECRET.encode() + b"\r\n0\r\n\r\n",
    "bad-method": b"G\x01T / HTTP/1.1\r\nHost: t\r\n" + AUTH + b"\r\n",
    "bad-version": b"GET / HTTP/9.x\r\nHost: t\r\n" + AUTH + b"\r\n",
    "space-before-colon": b"GET /v1/models HTTP/1.1\r\nHost : t\r\n" + AUTH + b"\r\n",
    "nul-in-header": b"GET /v1/models HTTP/1.1\r\nHost: t\r\nX-A: a\x00b\r\n" + AUTH + b"\r\n",
    "two-content-lengths": b"POST /v1/x HTTP/1.1\r\nHost: t\r\n" + AUTH
                           + b"Content-Length: 1\r\nContent-Length: 2\r\n\r\nab",
    "bad-content-length": b"POST /v1/x HTTP/1.1\r\nHost: t\r\n" + AUTH + b"Content-Length: -1\r\n\r\n",
    "chunked-and-length": b"POST /v1/x HTTP/1.1\r\nHost: t\r\n" + AUTH
                          + b"Content-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
}


@pytest.fixture(scope="module")
def gateway(upstreams: Upstreams) -> Iterator[GatewayProcess]:
    with running_gateway(reference_config(upstreams, authTokens=[SECRET])) as process:
        yield process


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_request_gets_a_400_without_its_bytes(gateway: GatewayProcess, name: str) -> None:
    answer = gateway.raw(MALFORMED[name])
    assert answer.startswith(b"HTTP/1.") and b" 400 " in answer.split(b"\r\n", 1)[0], answer[:200]
    assert SECRET.encode() not in answer
    assert b"Bad Request: " in answer
    assert gateway.request("GET", "/v1/models", token=SECRET).status == 200  # still serving


def test_the_log_holds_one_line_per_refusal_and_no_secret(gateway: GatewayProcess) -> None:
    for data in MALFORMED.values():
        gateway.raw(data)
    log = gateway.stderr()
    assert SECRET not in log
    assert "Traceback" not in log
    refused = [e for e in map(json.loads, log.splitlines()) if e["event"] == "refused a malformed request"]
    assert len(refused) >= len(MALFORMED)
    assert all(e["peer"] == "127.0.0.1" and e["level"] == "info" for e in refused)
