"""Bodies are held within limits before their model is known (issue 16, finding 6): a body-routed
request reserves its body's size in a gateway-wide budget (maxBufferedBytes) before reading it, and a
path-routed body is read only once the model's slot is taken."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import pytest

from fleetllm_gateway.config import DEFAULT_MAX_BUFFERED_BYTES, ConfigError, parse_config
from fleetllm_gateway.limiter import ByteBudget
from tests.gateway.conftest import TOKEN, GatewayProcess, Upstreams, reference_config, running_gateway
from tests.gateway.upstreams import holding

URL = "http://127.0.0.1:9"


def _run(coroutine: object) -> object:
    return asyncio.run(coroutine)  # type: ignore[arg-type]


def test_budget_grants_in_order_and_times_out() -> None:
    async def scenario() -> list[object]:
        budget = ByteBudget(100, timeout=0.05)
        seen: list[object] = [await budget.acquire(60), await budget.acquire(40), budget.held]
        late = asyncio.create_task(budget.acquire(30))
        small = asyncio.create_task(budget.acquire(1))  # behind `late`: FIFO, no overtaking
        await asyncio.sleep(0)
        seen.append(small.done())
        budget.release(40)  # 30 fits, then 1 fits
        seen += [await late, await small, budget.held]
        seen.append(await budget.acquire(80))  # 91 held: waits 0.05 s, then gives up
        seen.append(budget.held)
        budget.release(31)
        budget.release(60)
        seen.append(budget.held)
        return seen

    assert _run(scenario()) == [True, True, 100, False, True, True, 91, False, 91, 0]


def test_budget_cancelled_waiter_lets_the_next_one_in() -> None:
    async def scenario() -> list[object]:
        budget = ByteBudget(10, timeout=0)
        assert await budget.acquire(8)
        big = asyncio.create_task(budget.acquire(9))
        small = asyncio.create_task(budget.acquire(2))
        await asyncio.sleep(0)
        big.cancel()
        granted = await small
        return [big.cancelled(), granted, budget.held]

    assert _run(scenario()) == [True, True, 10]


def test_zero_means_no_budget() -> None:
    budget = ByteBudget(0, timeout=1)
    assert budget.fits(10**12)
    assert _run(budget.acquire(10**12)) is True
    assert budget.held == 0


@pytest.mark.parametrize(("document", "expected"), [
    ({}, DEFAULT_MAX_BUFFERED_BYTES),
    ({"maxBodyBytes": 512 * 1024 * 1024}, 512 * 1024 * 1024),  # never below the body cap by default
    ({"maxBufferedBytes": 0}, 0),
    ({"maxBodyBytes": 10, "maxBufferedBytes": 10}, 10),
])
def test_max_buffered_bytes(document: dict[str, int], expected: int) -> None:
    config = parse_config(json.dumps({**document, "models": {"m": {"url": URL}}}))
    assert config.max_buffered_bytes == expected


def test_max_buffered_bytes_below_the_body_cap_is_refused() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(json.dumps({"maxBodyBytes": 2048, "maxBufferedBytes": 1024, "models": {"m": {"url": URL}}}))
    assert caught.value.problems == ["config: maxBufferedBytes (1024) must be at least maxBodyBytes (2048), or a "
                                     "body of the largest allowed size could never be read"]


def _hold(gw: GatewayProcess, head: bytes, sent: bytes) -> socket.socket:
    """A connection that sent a request head and part of its body, and waits."""
    sock = socket.create_connection(("127.0.0.1", gw.port), timeout=20)
    sock.sendall(head + sent)
    return sock


def test_bodies_held_in_memory_are_bounded_and_other_routes_are_not(upstreams: Upstreams) -> None:
    config = reference_config(upstreams, maxBodyBytes=1000, maxBufferedBytes=2000, queueTimeoutSeconds=0.3)
    head = b"POST /v1/x HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer tok\r\nContent-Length: 1000\r\n\r\n"
    with running_gateway(config) as gw:
        # Two bodies of which 900 bytes each were sent: 1,800 of the 2,000 bytes are held.
        held = [_hold(gw, head, b'{"model":"echo","pad":"' + b"x" * 877), _hold(gw, head, b"[" + b"0," * 449 + b"0")]
        try:
            time.sleep(0.3)
            assert gw.request("POST", "/v1/x", body=b'{"model":"echo"}').status == 200  # 16 bytes fit
            refused = gw.request("POST", "/v1/x", body=b'{"model":"echo","pad":"' + b"x" * 300 + b'"}')
            assert refused.status == 503
            assert "maxBufferedBytes" in refused.json()["error"]["message"]
            assert gw.request("GET", "/health", token=None).status == 200
            # Path-routed bodies are read whole before the slot too, in the same budget (issue 27)
            assert gw.request("POST", "/route/echo/x", body=b"x" * 100).status == 200
            assert gw.request("POST", "/route/echo/x", body=b"x" * 500).status == 503
        finally:
            for sock in held:
                sock.close()
        time.sleep(0.2)
        assert gw.request("POST", "/v1/x", body=b'{"model":"echo","pad":"' + b"x" * 900 + b'"}').status == 200
        metrics = gw.request("GET", "/metrics").body.decode()
        assert 'fleetllm_gateway_unrouted_requests_total{code="503"} 1' in metrics  # the path-routed one is echo's


def test_a_slow_sender_holds_only_what_it_sent(upstreams: Upstreams) -> None:
    """Declared lengths are not reserved up front: connections that declare the cap and send nothing
    hold nothing."""
    config = reference_config(upstreams, maxBodyBytes=1000, maxBufferedBytes=1000, queueTimeoutSeconds=0.3)
    head = b"POST /v1/x HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer tok\r\nContent-Length: 1000\r\n\r\n"
    chunked = b"POST /v1/x HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer tok\r\nTransfer-Encoding: chunked\r\n\r\n"
    with running_gateway(config) as gw:
        held = [_hold(gw, head, b"") for _ in range(5)] + [_hold(gw, chunked, b"2\r\n{}\r\n") for _ in range(5)]
        try:
            time.sleep(0.3)
            assert gw.request("POST", "/v1/x", body=b'{"model":"echo","pad":"' + b"x" * 900 + b'"}').status == 200
        finally:
            for sock in held:
                sock.close()


def test_a_full_model_refuses_a_path_routed_request_before_its_body(upstreams: Upstreams) -> None:
    """With the one slot of `echo` taken (and no queue), a path-routed request whose body never comes is
    refused at once: the body is read before a slot is taken (issue 27), but not for a model that could not
    give it one."""
    config = reference_config(upstreams, maxConcurrentRequests=1, maxQueuedRequests=0)
    with running_gateway(config) as gw:
        sock = socket.create_connection(("127.0.0.1", gw.port), timeout=20)
        try:
            with holding():  # the slot stays taken however slowly the machine runs
                sock.sendall(b"POST /route/echo/held HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer " + TOKEN.encode()
                             + b"\r\nContent-Length: 2\r\n\r\n{}")
                gw.wait_in_flight("echo", 1)
                waiting = socket.create_connection(("127.0.0.1", gw.port), timeout=5)
                waiting.sendall(b"POST /route/echo/x HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer " + TOKEN.encode()
                                + b"\r\nContent-Length: 10\r\n\r\n")  # and no body
                assert waiting.recv(4096).startswith(b"HTTP/1.1 503 ")
                waiting.close()
        finally:
            sock.close()
