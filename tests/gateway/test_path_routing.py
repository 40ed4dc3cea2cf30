"""Conformance group 6: `/route/{model}/` path routing (llmhop.md §4)."""

from __future__ import annotations

import base64

from tests.gateway.conftest import GatewayProcess


def test_prefix_is_stripped_and_any_body_passes(gw: GatewayProcess) -> None:
    reply = gw.request("POST", "/route/echo/detect?x=1", body=b"plain text, not JSON",
                       headers={"Content-Type": "text/plain", "X-Extra": "1"})
    assert reply.status == 200
    echo = reply.json()
    assert echo["method"] == "POST"
    assert echo["path"] == "/base/detect?backend=1&x=1"
    assert base64.b64decode(echo["body"]) == b"plain text, not JSON"
    assert reply.echo_headers["x-extra"] == ["1"]
    assert reply.echo_headers["content-length"] == ["20"]


def test_model_with_slash_is_written_percent_2f(gw: GatewayProcess) -> None:
    reply = gw.request("POST", "/route/Qwen%2FQwen3-8B/v1/chat/completions", body=b"{}")
    assert reply.status == 200
    assert reply.json()["path"] == "/base/v1/chat/completions?backend=1"


def test_escaping_of_the_remainder_is_kept(gw: GatewayProcess) -> None:
    assert gw.request("GET", "/route/echo/a%2Fb/c").json()["path"] == "/base/a%2Fb/c?backend=1"


def test_slash_only_remainder_reaches_the_base(gw: GatewayProcess) -> None:
    assert gw.request("GET", "/route/echo/").json()["path"] == "/base/?backend=1"


def test_missing_slash_redirects_307(gw: GatewayProcess) -> None:
    reply = gw.request("GET", "/route/echo?q=1")
    assert reply.status == 307
    assert reply.header("Location") == "/route/echo/?q=1"
    assert gw.request("POST", "/route/Qwen%2FQwen3-8B").header("Location") == "/route/Qwen%2FQwen3-8B/"


def test_unknown_model_is_404(gw: GatewayProcess) -> None:
    reply = gw.request("POST", "/route/nope/detect", body=b"x")
    assert reply.status == 404
    assert reply.json()["error"]["message"] == 'unknown model "nope"'


def test_methods_and_chunked_bodies_stream_through(gw: GatewayProcess) -> None:
    for method in ("PUT", "PATCH", "DELETE", "OPTIONS"):
        assert gw.request(method, "/route/echo/x", body=b"b").json()["method"] == method
    raw = gw.raw(b"POST /route/echo/up HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer tok\r\n"
                 b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")
    assert raw.startswith(b"HTTP/1.1 200")
    assert base64.b64encode(b"abcde") in raw


def test_header_injection_and_sockets_apply(gw: GatewayProcess) -> None:
    injected = gw.request("POST", "/route/injected/detect", body=b"t")
    assert injected.echo_headers["authorization"] == ["Bearer upstream-key"]
    sock = gw.request("POST", "/route/sock/detect?z=2", body=b"t")
    assert (sock.json()["backend"], sock.json()["path"]) == ("unix", "/detect?z=2")


def test_unlisted_is_path_routable(gw: GatewayProcess) -> None:
    assert gw.request("POST", "/route/hidden/detect", body=b"t").status == 200
