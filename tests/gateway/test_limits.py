"""Conformance group 7: body size cap and concurrency (llmhop.md §2), plus the per-model queue."""

from __future__ import annotations

import concurrent.futures
import time

import pytest

from tests.gateway.conftest import GatewayProcess, Upstreams, reference_config, running_gateway
from tests.gateway.upstreams import holding
from tests.installer.realprocs import wait_until


def _json_of_size(size: int) -> bytes:
    prefix = b'{"model":"echo","pad":"'
    return prefix + b"x" * (size - len(prefix) - 2) + b'"}'


@pytest.mark.parametrize("path", ["/v1/x", "/route/echo/x"])
def test_declared_length_over_the_cap_is_413(gw: GatewayProcess, path: str) -> None:
    reply = gw.request("POST", path, body=_json_of_size(1025))
    assert reply.status == 413
    assert reply.json()["error"]["message"] == "request body too large"


def test_declared_length_is_refused_before_the_body_is_sent(gw: GatewayProcess) -> None:
    raw = gw.raw(b"POST /v1/x HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer tok\r\nContent-Length: 999999\r\n"
                 b"Expect: 100-continue\r\nConnection: close\r\n\r\n")
    assert raw.startswith(b"HTTP/1.1 413")


@pytest.mark.parametrize("path", ["/v1/x", "/route/echo/x"])
def test_exactly_the_cap_passes(gw: GatewayProcess, path: str) -> None:
    assert gw.request("POST", path, body=_json_of_size(1024)).status == 200


@pytest.mark.parametrize("path", [b"/v1/x", b"/route/echo/x"])
def test_chunked_body_over_the_cap_is_413(gw: GatewayProcess, path: bytes) -> None:
    body = _json_of_size(1500)
    chunks = b"".join(b"%x\r\n%b\r\n" % (len(body[i:i + 500]), body[i:i + 500]) for i in range(0, len(body), 500))
    raw = gw.raw(b"POST %b HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer tok\r\nTransfer-Encoding: chunked\r\n"
                 b"Connection: close\r\n\r\n%b0\r\n\r\n" % (path, chunks))
    assert raw.startswith(b"HTTP/1.1 413")


def test_expect_100_continue_is_answered(gw: GatewayProcess) -> None:
    body = b'{"model":"echo"}'
    raw = gw.raw(b"POST /v1/x HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer tok\r\nContent-Length: 16\r\n"
                 b"Expect: 100-continue\r\nConnection: close\r\n\r\n" + body)
    assert raw.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200")
    assert b"expect" not in raw.lower().split(b"\r\n\r\n", 2)[2]  # not forwarded


def _slow_requests(gw: GatewayProcess, count: int, model: str = "echo") -> list[tuple[int, float]]:
    def one(_: int) -> tuple[int, float]:
        started = time.monotonic()
        status = gw.request("POST", "/slow", body=b'{"model":"%b"}' % model.encode()).status
        return status, time.monotonic() - started

    with concurrent.futures.ThreadPoolExecutor(count) as pool:
        return list(pool.map(one, range(count)))


def _held(pool: concurrent.futures.ThreadPoolExecutor, gw: GatewayProcess, count: int,
          model: str = "echo") -> list[concurrent.futures.Future[int]]:
    """`count` requests to the upstream's `.../held` path at once (inside `holding()`): their statuses."""
    body = b'{"model":"%b"}' % model.encode()
    return [pool.submit(lambda: gw.request("POST", "/held", body=body).status) for _ in range(count)]


def _answered(futures: list[concurrent.futures.Future[int]], count: int) -> list[int]:
    """The statuses of the first `count` requests answered (60 s at most)."""
    wait_until(f"{count} answered", lambda: sum(f.done() for f in futures) >= count)
    return [f.result() for f in futures if f.done()]


def test_n_plus_two_slow_requests_without_queue(gw: GatewayProcess) -> None:
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        with holding():
            requests = _held(pool, gw, 4)
            # The refusals are immediate, not after the slow ones finish: answered while the two that
            # have the slots are still held upstream.
            assert _answered(requests, 2) == [503, 503]
        statuses = sorted(f.result() for f in requests)
    assert statuses == [200, 200, 503, 503]


def test_limits_are_per_model(gw: GatewayProcess) -> None:
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        with holding():
            busy = _held(pool, gw, 2, "echo")
            gw.wait_in_flight("echo", 2)
            # echo is saturated; sock has its own slots.
            assert gw.request("POST", "/v1/x", body=b'{"model":"sock"}').status == 200
        assert sorted(f.result() for f in busy) == [200, 200]


def test_zero_disables_both_limits(upstreams: Upstreams) -> None:
    config = reference_config(upstreams, maxBodyBytes=0, maxConcurrentRequests=0)
    with running_gateway(config) as gateway:
        assert gateway.request("POST", "/v1/x", body=_json_of_size(200_000)).status == 200
        assert [s for s, _ in _slow_requests(gateway, 6)] == [200] * 6


def test_queue_waits_for_a_slot_then_refuses_past_its_length(upstreams: Upstreams) -> None:
    config = reference_config(upstreams, maxConcurrentRequests=1, maxQueuedRequests=2, queueTimeoutSeconds=30)
    with running_gateway(config) as gateway:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            with holding():  # while the first is held upstream, two wait in the queue
                requests = _held(pool, gateway, 4)
                assert _answered(requests, 1) == [503]
            statuses = sorted(f.result() for f in requests)
        assert statuses == [200, 200, 200, 503]  # 1 running + 2 queued, the 4th refused
        metrics = gateway.request("GET", "/metrics").body.decode()
        assert 'fleetllm_gateway_requests_total{model="echo",code="200"} 3' in metrics
        assert 'fleetllm_gateway_requests_total{model="echo",code="503"} 1' in metrics


def test_queue_wait_is_bounded(upstreams: Upstreams) -> None:
    config = reference_config(upstreams, maxConcurrentRequests=1, maxQueuedRequests=5, queueTimeoutSeconds=0.2)
    with running_gateway(config) as gateway, concurrent.futures.ThreadPoolExecutor(2) as pool:
        with holding():
            requests = _held(pool, gateway, 2)
            # gave up after its 0.2 s wait, long before the slot came free: answered while the
            # request that has the slot is still held upstream
            assert _answered(requests, 1) == [503]
        assert sorted(f.result() for f in requests) == [200, 503]


def test_per_model_override(upstreams: Upstreams) -> None:
    config = reference_config(upstreams, maxConcurrentRequests=1)
    config["models"]["echo"]["maxConcurrentRequests"] = 3
    with running_gateway(config) as gateway:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            with holding():  # the three admitted ones stay in flight until the fourth is answered
                requests = _held(pool, gateway, 4)
                assert _answered(requests, 1) == [503]
            assert sorted(f.result() for f in requests) == [200, 200, 200, 503]
        metrics = gateway.request("GET", "/metrics").body.decode()
        assert 'fleetllm_gateway_concurrency_limit{model="echo"} 3' in metrics
        assert 'fleetllm_gateway_concurrency_limit{model="sock"} 1' in metrics


def test_large_bodies_stream_both_ways(upstreams: Upstreams) -> None:
    import base64
    import hashlib

    config = reference_config(upstreams, maxBodyBytes=8 * 1024 * 1024)
    with running_gateway(config) as gateway:
        payload = bytes(range(256)) * (6 * 1024 * 1024 // 256)  # 6 MiB, streamed to the upstream
        for path in ("/route/echo/upload", "/route/sock/upload"):
            reply = gateway.request("POST", path, body=payload, timeout=60)
            assert reply.status == 200
            echoed = base64.b64decode(reply.json()["body"])  # an ~8 MiB answer, relayed as it streams
            assert hashlib.sha256(echoed).digest() == hashlib.sha256(payload).digest()
        body = b'{"model":"echo","blob":"' + b"a" * (7 * 1024 * 1024) + b'"}'  # buffered, then forwarded
        reply = gateway.request("POST", "/v1/x", body=body, timeout=60)
        assert base64.b64decode(reply.json()["body"]) == body
        assert gateway.request("POST", "/route/echo/upload", body=payload + payload).status == 413


def test_default_limits_take_a_burst_vllm_would_batch(upstreams: Upstreams) -> None:
    """Issue 15: at 128 concurrent requests to one slow model, the old default (64 slots and 16 queued per
    model) answered 503 to 48 of them where vLLM would have batched them all. Without limits in its config
    each model now gets vLLM 0.32's default batch (--max-num-seqs 1024 on an H100-class card), so the same
    burst is served whole."""
    config = reference_config(upstreams)
    del config["maxConcurrentRequests"], config["maxQueuedRequests"]
    with running_gateway(config) as gateway:
        statuses = [status for status, _ in _slow_requests(gateway, 128)]
        assert statuses.count(200) == 128, sorted(set(statuses))
        metrics = gateway.request("GET", "/metrics").body.decode()
        assert 'fleetllm_gateway_concurrency_limit{model="echo"} 1024' in metrics
