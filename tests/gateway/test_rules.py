"""The pure rules: URL joining, header rewrites, bearer parsing, the limiter's queue, metrics text."""

from __future__ import annotations

import asyncio

import pytest

from fleetllm_gateway.forwarding import bearer_ok, client_headers, models_api_name, parse_route, upstream_headers
from fleetllm_gateway.limiter import Admission, Limiter
from fleetllm_gateway.metrics import Metrics
from fleetllm_gateway.target import parse_target


@pytest.mark.parametrize(("url", "path", "query", "expected"), [
    ("http://h", "/v1/x", "", "/v1/x"),
    ("http://h/base?backend=1", "/v1/x", "a=1;b", "/base/v1/x?backend=1&a=1;b"),
    ("http://h/base/", "/v1/x", "", "/base/v1/x"),
    ("http://h/base", "/", "", "/base/"),
    ("http://h?k=v", "/x", "", "/x?k=v"),
    ("unix:///s.sock", "/a%2Fb", "q", "/a%2Fb?q"),
])
def test_request_target(url: str, path: str, query: str, expected: str) -> None:
    assert parse_target(url).request_target(path, query) == expected


def test_authority() -> None:
    assert parse_target("http://[::1]:8000").authority == "[::1]:8000"
    assert parse_target("https://api.example").authority == "api.example"
    assert parse_target("unix:///run/a%20b.sock").socket_path == "/run/a b.sock"


def test_parse_route() -> None:
    route = parse_route("/route/Qwen%2FQwen3-8B/v1/x%2Fy", "")
    assert (route.model, route.rest) == ("Qwen/Qwen3-8B", "/v1/x%2Fy")  # type: ignore[union-attr]
    assert parse_route("/route/m", "q=1").location == "/route/m/?q=1"  # type: ignore[union-attr]
    assert parse_route("/route/", "") is None
    assert parse_route("/v1/route/m/", "") is None
    assert models_api_name("/v1/models/a%2Fb") == "a/b"
    assert models_api_name("/v1/models/a/b") is None
    assert models_api_name("/v1/models/") is None


def test_bearer() -> None:
    tokens = [b"tok", b"other"]
    assert bearer_ok("Bearer tok", tokens)
    assert bearer_ok("bEaReR other", tokens)
    assert bearer_ok("Bearer tok \t", tokens)  # surrounding whitespace is not part of a field value
    for bad in (None, "Bearer", "Bearer  tok", "Bearer tok x", "Basic tok", "tok", "Bearer to"):
        assert not bearer_ok(bad, tokens), bad


def test_upstream_headers_order_and_overrides() -> None:
    host, headers = upstream_headers(
        [("Host", "front"), ("Connection", "close, X-Hop"), ("X-Hop", "1"), ("Authorization", "Bearer c"),
         ("X-Forwarded-For", "9.9.9.9"), ("Content-Length", "5"), ("x-keep", "a"), ("X-Keep", "b")],
        client_ip="10.0.0.1", client_host="front", strip_authorization=True,
        injected=[("X-Keep", "injected"), ("Host", "back"), ("Content-Length", "1")], default_host="h:1")
    assert host == "back"
    assert headers == [("X-Forwarded-For", "10.0.0.1"), ("X-Forwarded-Host", "front"),
                       ("X-Forwarded-Proto", "http"), ("X-Keep", "injected")]
    host, headers = upstream_headers([("Authorization", "Bearer c")], client_ip="::1", client_host=None,
                                     strip_authorization=False, injected=(), default_host="h:1")
    assert host == "h:1"
    assert ("Authorization", "Bearer c") in headers
    assert ("X-Forwarded-Host", "h:1") not in headers


def test_client_headers() -> None:
    assert client_headers([("Connection", "X-A"), ("X-A", "1"), ("Set-Cookie", "a"), ("Set-Cookie", "b"),
                           ("Transfer-Encoding", "chunked"), ("Content-Length", "3")]) == \
        [("Set-Cookie", "a"), ("Set-Cookie", "b")]


def test_limiter_queue_is_fifo_bounded_and_cancellable() -> None:
    async def scenario() -> None:
        limiter = Limiter(limit=1, max_queued=2, timeout=0)
        assert await limiter.acquire() is Admission.ADMITTED
        order: list[str] = []

        async def waiter(name: str) -> None:
            assert await limiter.acquire() is Admission.ADMITTED
            order.append(name)

        first = asyncio.ensure_future(waiter("first"))
        second = asyncio.ensure_future(waiter("second"))
        await asyncio.sleep(0)
        assert limiter.queued == 2
        assert await limiter.acquire() is Admission.QUEUE_FULL
        first.cancel()  # a client gives up while queued
        await asyncio.sleep(0)
        assert limiter.queued == 1
        limiter.release()  # the slot goes to "second", not to a newcomer
        await second
        assert order == ["second"]
        assert (limiter.active, limiter.queued) == (1, 0)
        limiter.release()
        assert limiter.active == 0

    asyncio.run(scenario())


def test_limiter_timeout_and_unlimited() -> None:
    async def scenario() -> None:
        limiter = Limiter(limit=1, max_queued=1, timeout=0.01)
        assert await limiter.acquire() is Admission.ADMITTED
        assert await limiter.acquire() is Admission.TIMED_OUT
        assert limiter.queued == 0
        unlimited = Limiter(limit=0, max_queued=0, timeout=0)
        assert all([await unlimited.acquire() is Admission.ADMITTED for _ in range(100)])

    asyncio.run(scenario())


def test_metrics_text() -> None:
    metrics = Metrics([("a\"b", 4)])
    stats = metrics.models['a"b']
    stats.count(200)
    stats.latency.observe(0.003)
    metrics.count_unrouted(401)
    stats.live(2, 1)
    text = metrics.render()
    assert 'fleetllm_gateway_requests_total{model="a\\"b",code="200"} 1' in text
    assert 'fleetllm_gateway_requests_in_flight{model="a\\"b"} 2' in text
    assert 'fleetllm_gateway_requests_queued{model="a\\"b"} 1' in text
    assert 'fleetllm_gateway_upstream_latency_seconds_bucket{model="a\\"b",le="0.0025"} 0' in text
    assert 'fleetllm_gateway_upstream_latency_seconds_bucket{model="a\\"b",le="0.005"} 1' in text
    assert 'fleetllm_gateway_upstream_latency_seconds_count{model="a\\"b"} 1' in text
    assert 'fleetllm_gateway_unrouted_requests_total{code="401"} 1' in text
    assert text.endswith("\n")
