"""Conformance group 5: what the upstream receives and what the client gets back (llmhop.md §3, §6)."""

from __future__ import annotations

import base64
import json
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.gateway.conftest import GatewayProcess, Upstreams, reference_config, running_gateway
from tests.gateway.upstreams import BIG_SIZE, start_tls_echo

BODY = '{"model":"echo",  "messages":[{"role":"user","content":"héllo \\u00e9"}] , "n":1}'.encode()


def test_body_is_forwarded_byte_identical(gw: GatewayProcess) -> None:
    reply = gw.request("POST", "/v1/chat/completions", body=BODY, headers={"Content-Type": "application/json"})
    assert reply.status == 200
    echo = reply.json()
    assert base64.b64decode(echo["body"]) == BODY
    assert echo["method"] == "POST"
    assert reply.echo_headers["content-length"] == [str(len(BODY))]
    assert reply.echo_headers["content-type"] == ["application/json"]


def test_path_and_query_join_the_base(gw: GatewayProcess) -> None:
    reply = gw.request("POST", "/v1/chat/completions?valid=1&semi=one;two", body=BODY)
    assert reply.json()["path"] == "/base/v1/chat/completions?backend=1&valid=1&semi=one;two"
    assert gw.request("POST", "/v1/x", body=BODY).json()["path"] == "/base/v1/x?backend=1"


def test_host_and_forwarding_headers(gw: GatewayProcess) -> None:
    reply = gw.request("POST", "/v1/x", body=BODY, headers={
        "Host": "client.example:1234", "Forwarded": "for=1.2.3.4", "X-Forwarded-For": "1.2.3.4",
        "X-Forwarded-Host": "evil.example", "X-Forwarded-Proto": "https", "User-Agent": "conformance/1"})
    received = reply.echo_headers
    assert received["host"] == ["client.example:1234"]
    assert received["x-forwarded-for"] == ["127.0.0.1"]
    assert received["x-forwarded-host"] == ["client.example:1234"]
    assert received["x-forwarded-proto"] == ["http"]
    assert "forwarded" not in received
    assert received["user-agent"] == ["conformance/1"]


def test_no_user_agent_is_added(gw: GatewayProcess) -> None:
    assert "user-agent" not in gw.request("POST", "/v1/x", body=BODY).echo_headers


def test_injected_headers_win_and_client_bearer_never_leaks(gw: GatewayProcess) -> None:
    body = b'{"model":"injected"}'
    reply = gw.request("POST", "/v1/x", body=body, headers={"X-Injected": "from-client", "x-other": "kept"})
    received = reply.echo_headers
    assert received["authorization"] == ["Bearer upstream-key"]
    assert received["x-injected"] == ["yes"]
    assert received["host"] == ["injected.example"]
    assert received["x-other"] == ["kept"]
    assert "tok" not in reply.body.decode()


def test_request_hop_by_hop_headers_are_dropped(gw: GatewayProcess) -> None:
    reply = gw.request("POST", "/v1/x", body=BODY, headers={
        "Connection": "keep-alive, X-Custom-Hop", "X-Custom-Hop": "1", "Keep-Alive": "timeout=5",
        "Proxy-Authorization": "Basic abc", "Proxy-Connection": "keep-alive", "Te": "trailers, deflate",
        "Trailer": "X-T", "X-End-To-End": "1"})
    received = reply.echo_headers
    for name in ("x-custom-hop", "keep-alive", "proxy-authorization", "proxy-connection", "trailer"):
        assert name not in received, name
    assert received["te"] == ["trailers"]
    assert received["x-end-to-end"] == ["1"]
    assert received.get("connection", ["keep-alive"]) != ["keep-alive, X-Custom-Hop"]


def test_te_without_trailers_is_dropped(gw: GatewayProcess) -> None:
    assert "te" not in gw.request("POST", "/v1/x", body=BODY, headers={"Te": "deflate"}).echo_headers


def test_response_hop_by_hop_headers_are_dropped(gw: GatewayProcess) -> None:
    reply = gw.request("GET", "/route/echo/hop")
    assert reply.status == 200
    assert reply.body == b"hello"
    names = {name.lower() for name, _ in reply.headers}
    assert "x-kept" in names
    for name in ("x-named-hop", "keep-alive", "proxy-authenticate", "upgrade", "trailer"):
        assert name not in names, name


def test_chunked_request_with_trailers_is_forwarded(gw: GatewayProcess) -> None:
    body = b'{"model":"echo"}'
    raw = gw.raw(b"POST /v1/x HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer tok\r\nTransfer-Encoding: chunked\r\n"
                 b"Trailer: X-Sum\r\nConnection: close\r\n\r\n"
                 b"%x\r\n%b\r\n0\r\nX-Sum: 1\r\n\r\n" % (len(body), body))
    assert raw.startswith(b"HTTP/1.1 200")
    assert base64.b64encode(body) in raw


def test_unix_socket_upstream_sees_path_only_and_client_host(gw: GatewayProcess) -> None:
    reply = gw.request("POST", "/v1/chat/completions?x=1", body=b'{"model":"sock"}', headers={"Host": "front:80"})
    echo = reply.json()
    assert echo["backend"] == "unix"
    assert echo["path"] == "/v1/chat/completions?x=1"
    assert reply.echo_headers["host"] == ["front:80"]


def test_unlisted_model_is_routable(gw: GatewayProcess) -> None:
    assert gw.request("POST", "/v1/x", body=b'{"model":"hidden"}').status == 200


def test_dead_upstream_is_502_json(gw: GatewayProcess) -> None:
    reply = gw.request("POST", "/v1/x", body=b'{"model":"dead"}')
    assert reply.status == 502
    error = reply.json()["error"]
    assert error["code"] == "upstream_error"
    assert error["message"].startswith('upstream of model "dead" failed: connect failed')


def test_upstream_status_and_large_bodies_pass(gw: GatewayProcess) -> None:
    assert gw.request("POST", "/v1/status/418", body=BODY).status == 418
    big = gw.request("GET", "/route/echo/big")
    assert (big.status, len(big.body), big.header("Content-Length")) == (200, BIG_SIZE, str(BIG_SIZE))
    head = gw.request("HEAD", "/route/echo/big")
    assert (head.status, head.body, head.header("Content-Length")) == (200, b"", str(BIG_SIZE))


def test_keep_alive_connection_serves_many_requests(gw: GatewayProcess) -> None:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=10)
    try:
        for _ in range(20):
            conn.request("POST", "/v1/x", body=BODY, headers={"Authorization": "Bearer tok"})
            response = conn.getresponse()
            assert response.status == 200
            response.read()
    finally:
        conn.close()


def test_client_disconnect_releases_the_slot_and_the_upstream(gw: GatewayProcess) -> None:
    with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as sock:
        sock.sendall(b"GET /route/echo/sse HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer tok\r\n\r\n")
        received = b""
        while b"data:" not in received:
            received += sock.recv(65536)
    left = time.monotonic()
    line = 'fleetllm_gateway_requests_in_flight{model="echo"} 0'
    while line not in gw.request("GET", "/metrics").body.decode():
        assert time.monotonic() - left < 0.8, "slot still held after the client left"
        time.sleep(0.01)


@pytest.mark.integration  # CI has openssl: this must run there
@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make a certificate")
def test_https_upstream_is_verified_against_the_trust_store(upstreams: Upstreams, tmp_path: Path) -> None:
    cert, key = str(tmp_path / "cert.pem"), str(tmp_path / "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost", "-keyout", key, "-out", cert],
                   check=True, capture_output=True)
    server, port = start_tls_echo(cert, key)
    try:
        config = reference_config(upstreams, models={"tls": {"url": f"https://localhost:{port}/base"}})
        with running_gateway(config, env={"SSL_CERT_FILE": cert}) as gateway:
            reply = gateway.request("POST", "/v1/x", body=b'{"model":"tls"}')
            assert (reply.status, reply.json()["path"]) == (200, "/base/v1/x")
        with running_gateway(config) as untrusting:  # the system trust store does not know this certificate
            reply = untrusting.request("POST", "/v1/x", body=b'{"model":"tls"}')
            assert reply.status == 502
            assert "certificate" in reply.json()["error"]["message"].lower()
    finally:
        server.stop()


def test_absolute_form_request_target_keeps_only_its_path(gw: GatewayProcess) -> None:
    raw = gw.raw(b"POST http://elsewhere.example/v1/x?q=1 HTTP/1.1\r\nHost: elsewhere.example\r\n"
                 b"Authorization: Bearer tok\r\nContent-Length: 16\r\nConnection: close\r\n\r\n{\"model\":\"echo\"}")
    assert raw.startswith(b"HTTP/1.1 200")
    assert b'"path": "/base/v1/x?backend=1&q=1"' in raw


def test_upstream_failures_are_logged_sparingly(upstreams: Upstreams) -> None:
    with running_gateway(reference_config(upstreams)) as gateway:
        for _ in range(5):
            assert gateway.request("POST", "/v1/x", body=b'{"model":"dead"}').status == 502
        lines = [json.loads(line) for line in gateway.stderr().splitlines() if "upstream failed" in line]
        assert [{k: v for k, v in line.items() if k != "ts"} for line in lines] == [
            {"level": "warning", "logger": "gateway", "event": "upstream failed", "model": "dead", "where": None,
             "error": "connect failed: Connection refused", "more_since_last": 0}]
        metrics = gateway.request("GET", "/metrics").body.decode()
        assert 'fleetllm_gateway_upstream_errors_total{model="dead"} 5' in metrics


def test_latency_and_duration_are_timed_finer_than_a_millisecond(upstreams: Upstreams) -> None:
    """uvloop's loop time moves in whole milliseconds: exchanges timed by it summed to whole milliseconds
    (each counted as 0 or 1 ms however long it took). The clock used counts fractions of one."""
    with running_gateway(reference_config(upstreams)) as gateway:
        for _ in range(5):
            assert gateway.request("POST", "/v1/x", body=b'{"model":"echo"}').status == 200
        metrics = gateway.request("GET", "/metrics").body.decode()
    for name in ("upstream_latency_seconds", "request_duration_seconds"):
        prefix = f'fleetllm_gateway_{name}_sum{{model="echo"}} '
        total = float(next(line for line in metrics.splitlines() if line.startswith(prefix))[len(prefix):])
        assert f'fleetllm_gateway_{name}_count{{model="echo"}} 5' in metrics
        assert total > 0, name
        assert abs(total * 1000 - round(total * 1000)) > 1e-6, f"{name}: {total} s is a whole number of ms"
