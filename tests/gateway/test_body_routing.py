"""Conformance group 4: choosing the model from the JSON body (llmhop.md §2.5-§2.6)."""

from __future__ import annotations

import pytest

from tests.gateway.conftest import GatewayProcess


@pytest.mark.parametrize("body", [b'{"model":"echo"', b"", b'["echo"]', b'{"model":123}', b'{"model":true}',
                                  b'{"model":{"id":"echo"}}', b'"echo"', b"42", b'{"model":"echo","x":NaN}'])
def test_invalid_json(gw: GatewayProcess, body: bytes) -> None:
    reply = gw.request("POST", "/v1/chat/completions", body=body)
    assert reply.status == 400
    assert reply.json()["error"] == {"message": "invalid JSON request body", "type": "invalid_request_error",
                                     "param": None, "code": "invalid_json"}


@pytest.mark.parametrize("body", [b"{}", b'{"model":null}', b"null", b'{"model":"echo","model":null}',
                                  b'{"messages":[{"model":"echo"}]}'])
def test_missing_model(gw: GatewayProcess, body: bytes) -> None:
    reply = gw.request("POST", "/v1/chat/completions", body=body)
    assert reply.status == 400
    assert reply.json()["error"]["message"] == "missing model"


@pytest.mark.parametrize(("body", "name"), [(b'{"model":""}', ""), (b'{"model":"nope"}', "nope"),
                                            (b'{"model":"say \\"hi\\""}', 'say \\"hi\\"')])
def test_unknown_model_is_404_quoted(gw: GatewayProcess, body: bytes, name: str) -> None:
    reply = gw.request("POST", "/v1/chat/completions", body=body)
    assert reply.status == 404
    assert reply.json()["error"]["message"] == f'unknown model "{name}"'


def test_duplicate_model_key_last_wins(gw: GatewayProcess) -> None:
    reply = gw.request("POST", "/v1/x", body=b'{"model":"dead","model":"sock"}')
    assert reply.status == 200
    assert reply.json()["backend"] == "unix"


def test_nested_model_is_ignored(gw: GatewayProcess) -> None:
    reply = gw.request("POST", "/v1/x", body=b'{"extra":{"model":"dead"},"model":"echo"}')
    assert reply.status == 200


def test_broken_body_framing_is_400(gw: GatewayProcess) -> None:
    # A chunked body that breaks its own framing: the HTTP server answers 400 (in plain text) itself.
    raw = gw.raw(b"POST /v1/x HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer tok\r\nTransfer-Encoding: chunked\r\n"
                 b"Connection: close\r\n\r\nzz\r\n{}\r\n0\r\n\r\n")
    assert raw.split(b"\r\n", 1)[0].split(b" ")[1] == b"400"
