"""HTTP_PROXY / HTTPS_PROXY / NO_PROXY for TCP upstreams, as Go's transport honours them (llmhop.md §3)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetllm_gateway.proxyenv import ProxyError, bypassed, proxy_for
from fleetllm_gateway.target import parse_target
from tests.gateway.conftest import Upstreams, reference_config, running_gateway
from tests.gateway.upstreams import ForwardProxy, start_proxy, start_tls_echo


@pytest.fixture
def proxy() -> Iterator[tuple[ForwardProxy, int]]:
    running, server, port = start_proxy()
    try:
        yield server, port
    finally:
        running.stop()


def test_plain_http_goes_through_the_proxy_in_absolute_form(upstreams: Upstreams,
                                                            proxy: tuple[ForwardProxy, int]) -> None:
    server, proxy_port = proxy
    url = f"http://echo.test:{upstreams.tcp_port}/base?backend=1"
    config = reference_config(upstreams, models={"far": {"url": url}, "near": {"url": upstreams.base_url}})
    env = {"HTTP_PROXY": f"http://user:p%40ss@127.0.0.1:{proxy_port}", "NO_PROXY": ""}
    with running_gateway(config, env=env) as gateway:
        reply = gateway.request("POST", "/v1/x?q=1", body=b'{"model":"far"}')
        assert reply.status == 200
        assert reply.json()["path"] == f"http://echo.test:{upstreams.tcp_port}/base/v1/x?backend=1&q=1"
        # Loopback upstreams are never proxied.
        assert gateway.request("POST", "/v1/x", body=b'{"model":"near"}').json()["path"] == "/base/v1/x?backend=1"
    assert server.seen == [(f"POST http://echo.test:{upstreams.tcp_port}/base/v1/x?backend=1&q=1 HTTP/1.1",
                            "Basic dXNlcjpwQHNz")]


def test_no_proxy_dials_directly(upstreams: Upstreams, proxy: tuple[ForwardProxy, int]) -> None:
    server, proxy_port = proxy
    config = reference_config(upstreams, models={"far": {"url": f"http://echo.invalid:{upstreams.tcp_port}"}})
    env = {"HTTP_PROXY": f"127.0.0.1:{proxy_port}", "NO_PROXY": "example.com,.invalid"}
    with running_gateway(config, env=env) as gateway:
        assert gateway.request("POST", "/v1/x", body=b'{"model":"far"}').status == 502  # echo.invalid: no DNS
    assert server.seen == []


@pytest.mark.integration  # CI has openssl: this must run there
@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make a certificate")
def test_https_goes_through_a_connect_tunnel(upstreams: Upstreams, proxy: tuple[ForwardProxy, int],
                                             tmp_path: Path) -> None:
    server, proxy_port = proxy
    cert, key = str(tmp_path / "cert.pem"), str(tmp_path / "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=tls.test",
                    "-addext", "subjectAltName=DNS:tls.test", "-keyout", key, "-out", cert],
                   check=True, capture_output=True)
    tls, port = start_tls_echo(cert, key)
    try:
        config = reference_config(upstreams, models={"tls": {"url": f"https://tls.test:{port}/base"}})
        env = {"HTTPS_PROXY": f"http://127.0.0.1:{proxy_port}", "SSL_CERT_FILE": cert}
        with running_gateway(config, env=env) as gateway:
            reply = gateway.request("POST", "/v1/x", body=b'{"model":"tls"}')
            assert (reply.status, reply.json()["path"]) == (200, "/base/v1/x")
            assert reply.echo_headers["host"][0].startswith("127.0.0.1:")  # the client's Host, as always
    finally:
        tls.stop()
    assert server.seen == [(f"CONNECT tls.test:{port} HTTP/1.1", None)]


def test_proxy_selection_rules() -> None:
    env = {"HTTP_PROXY": "proxy:3128", "https_proxy": "http://p2:8080", "NO_PROXY": "*.internal,10.0.0.0/8,h:81"}
    assert proxy_for(parse_target("http://api.example"), env).host == "proxy"  # type: ignore[union-attr]
    assert proxy_for(parse_target("https://api.example"), env).port == 8080  # type: ignore[union-attr]
    for url in ("http://localhost:1", "http://127.0.0.2", "http://[::1]:8", "unix:///s.sock",
                "http://a.internal", "http://10.1.2.3", "http://h:81"):
        assert proxy_for(parse_target(url), env) is None, url
    assert proxy_for(parse_target("http://h:82"), env) is not None
    assert bypassed("x.example.com", 80, "example.com")
    assert not bypassed("notexample.com", 80, "example.com")
    with pytest.raises(ProxyError, match="only http://"):
        proxy_for(parse_target("http://api.example"), {"HTTP_PROXY": "socks5://user:secret@p:1"})
    with pytest.raises(ProxyError) as caught:
        proxy_for(parse_target("https://api.example"), {"HTTPS_PROXY": "https://user:secret@p:1"})
    assert "secret" not in str(caught.value)


def test_unusable_proxy_stops_start_up(upstreams: Upstreams, tmp_path: Path) -> None:
    config = reference_config(upstreams, models={"far": {"url": "http://api.example"}})
    with pytest.raises(AssertionError, match="only http://"), running_gateway(config, env={"HTTP_PROXY": "socks5://p:1"}):
        pass
