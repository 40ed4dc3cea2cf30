"""What each step of the gateway's request path costs when the CPU caches have gone cold, and warm.

    python bench/gateway_cold.py [--samples 300] [--tree CHECKOUT]

Why: an SSE client's next request comes after a stream of tens of milliseconds, during which the worker
ran little of the request path; on a shared 2-vCPU machine its code and data have left the caches by
then, and each step costs several times its warm figure (docs/benchmarks.md, "Ninth round": the same
request took 86 us to parse in a worker between SSE streams, 15 us under a steady load). This bench
measures that in one process: before each cold sample it writes one byte in every 64 of a 32 MiB buffer
(evicting the caches), then times one call; warm samples repeat the call. Printed per step: the median
of each, in microseconds, and their ratio; the last row is a whole SSE request through the real gateway
(HttpServer and Gateway on loopback TCP, bench/gateway_upstream.py's upstream, all in this loop), from
the client's send to its first event. Each step's answer is checked (a 200 queued, the model found, the
bearer accepted, the event handed out, the SSE request answered 200); a wrong one fails the run.
`--tree`: measure the gateway of another checkout (or a `git archive` of its gateway/ and contract/), as
bench/gateway_llmhop.py does.
Absolute figures depend on the machine; compare steps and trees in one run.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

BODY = json.dumps({"model": "m", "stream": True}).encode()
REQUEST = (b"POST /v1/sse HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer token\r\n"
           b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%b" % (len(BODY), BODY))
HEADERS = [("Host", "bench"), ("Authorization", "Bearer token"), ("Content-Type", "application/json"),
           ("Content-Length", str(len(BODY)))]
EVENT = b'data: {"n": 0}\n\n'
_EVICT = bytearray(32 * 1024 * 1024)
_ONES = b"\x01" * (len(_EVICT) // 64)


def evict() -> None:
    _EVICT[::64] = _ONES


async def timed(step: Callable[[Any], object], samples: int, prepare: Callable[[], Any] = lambda: None,
                settle: Callable[[], Awaitable[None]] | None = None) -> tuple[float, float]:
    """Median microseconds of one `step(prepare())`, cold (caches evicted after `prepare`) and warm; an
    awaitable it returns is awaited within the timing; `settle()`, if given, is awaited after each one."""
    medians = []
    for cold in (True, False):
        times = []
        for _ in range(samples):
            arg = prepare()
            if cold:
                evict()
            started = time.perf_counter()
            result = step(arg)
            if inspect.isawaitable(result):
                await result
            times.append((time.perf_counter() - started) * 1e6)
            if settle is not None:
                await settle()
        medians.append(statistics.median(times))
    return medians[0], medians[1]


class _Transport:
    """What HttpConnection needs of a transport; keeps what is written."""

    def __init__(self) -> None:
        self.written: list[bytes] = []

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else default

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        pass


async def measure(samples: int) -> list[tuple[str, float, float]]:
    from fleetllm_gateway import jsonscan
    from fleetllm_gateway.connection import Connection
    from fleetllm_gateway.forwarding import bearer_ok, upstream_headers
    from fleetllm_gateway.httpserver import HttpServer
    from fleetllm_gateway.httpserver import Response as Answer
    from fleetllm_gateway.response import Response

    loop = asyncio.get_running_loop()
    rows: list[tuple[str, float, float]] = []
    answers = 0

    async def handler(request: Any) -> Answer:
        nonlocal answers
        answers += 1
        return Answer(200, b"ok")

    transport = _Transport()
    conn = HttpServer(handler, loop)()
    conn.connection_made(transport)  # type: ignore[arg-type]

    async def answered() -> None:  # the request is answered before the next one
        for _ in range(4):
            await asyncio.sleep(0)

    rows.append(("parse a request and queue its answer (data_received)",
                 *await timed(lambda _: conn.data_received(REQUEST), samples, settle=answered)))
    if answers != 2 * samples or sum(1 for data in transport.written if data.startswith(b"HTTP/1.1 200 ")) != answers:
        raise SystemExit(f"FAILED: {answers} of {2 * samples} requests answered 200")

    def bearer(_: None) -> None:
        if not bearer_ok("Bearer token", [b"token"]):
            raise SystemExit("FAILED: the bearer was refused")

    def model(_: None) -> None:
        if jsonscan.loads_model(BODY) != "m":
            raise SystemExit("FAILED: the model was not found")

    def headers(_: None) -> None:
        upstream_headers(HEADERS, client_ip="127.0.0.1", client_host="bench", strip_authorization=True,
                         injected=(), default_host="127.0.0.1:8000")

    rows.append(("check the bearer (bearer_ok)", *await timed(bearer, samples)))
    rows.append(("find the model of a small body (loads_model)", *await timed(model, samples)))
    rows.append(("rewrite the headers for upstream (upstream_headers)", *await timed(headers, samples)))

    chunk = b"%x\r\n%b\r\n" % (len(EVENT), EVENT)

    def response() -> Response:  # a chunked response with its first event in the buffer, made untimed
        upstream = Connection()
        upstream.buffer += chunk
        return Response(lambda c: None, upstream, 200, "OK", [("Transfer-Encoding", "chunked")], False)

    async def first_event(answer: Response) -> None:
        take = getattr(answer, "next_chunk", None)  # a tree before it had only chunks()
        event = await (take() if take else answer.chunks().__anext__())
        if event != EVENT:
            raise SystemExit(f"FAILED: the first event came out as {event!r}")

    rows.append(("hand out a chunked response's first event (next_chunk)",
                 *await timed(first_event, samples, prepare=response)))

    async def nothing() -> None:
        pass

    def task(_: None) -> None:
        loop.create_task(nothing()).cancel()

    def future(_: None) -> None:
        loop.create_future().set_result(None)

    rows.append(("start a task (create_task)", *await timed(task, samples)))
    rows.append(("wake a waiting one instead (a future's set_result)", *await timed(future, samples)))
    await asyncio.sleep(0)
    rows.append(("a whole SSE request, sent to first event (one loop)", *await whole_request(samples)))
    return rows


class _Client(asyncio.Protocol):
    """Sends a request; `first` is resolved at its first event, `done` at the end of its answer."""

    def __init__(self) -> None:
        self.received = bytearray()
        self.first: asyncio.Future[None] | None = None
        self.done: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.Transport = transport  # type: ignore[assignment]

    def send(self, data: bytes) -> None:
        loop = asyncio.get_running_loop()
        self.received.clear()
        self.first, self.done = loop.create_future(), loop.create_future()
        self.transport.write(data)

    def data_received(self, data: bytes) -> None:
        self.received += data
        if self.first is not None and not self.first.done() and b"data:" in self.received:
            self.first.set_result(None)
        if self.done is not None and not self.done.done() and self.received.endswith(b"0\r\n\r\n"):
            self.done.set_result(None)


async def whole_request(samples: int) -> tuple[float, float]:
    """The SSE request of bench/gateway_llmhop.py through the real gateway (its Gateway and HttpServer
    over loopback TCP) to bench/gateway_upstream.py's upstream, both in this loop, from the client's send
    to the first event's arrival, on one keep-alive connection; the upstream sends one event, not three."""
    sys.path.insert(0, str(ROOT))
    from bench import gateway_upstream
    from fleetllm_gateway.app import Gateway
    from fleetllm_gateway.config import parse_config
    from fleetllm_gateway.httpserver import HttpServer

    gateway_upstream.SSE_EVENTS = 1
    loop = asyncio.get_running_loop()
    upstream = await loop.create_server(gateway_upstream.Upstream, "127.0.0.1", 0)
    upstream_port = upstream.sockets[0].getsockname()[1]
    gateway = Gateway(parse_config(json.dumps({"authTokens": ["token"], "models": {
        "m": {"url": f"http://127.0.0.1:{upstream_port}"}}})))
    server = await loop.create_server(HttpServer(gateway.handle, loop), "127.0.0.1", 0)
    _, client = await loop.create_connection(_Client, "127.0.0.1", server.sockets[0].getsockname()[1])

    async def request(_: None) -> None:
        client.send(REQUEST)
        await client.first  # type: ignore[misc]

    async def answered() -> None:
        await client.done  # type: ignore[misc]
        if not client.received.startswith(b"HTTP/1.1 200 "):
            raise SystemExit(f"FAILED: the SSE request was answered {bytes(client.received[:40])!r}")

    try:
        return await timed(request, samples, settle=answered)
    finally:
        client.transport.close()
        gateway.close()
        server.close()
        upstream.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=300, help="cold and warm samples of each step")
    parser.add_argument("--tree", type=Path, default=ROOT,
                        help="the checkout (or `git archive` of gateway/ and contract/) whose gateway is measured")
    args = parser.parse_args(argv)
    sys.path[:0] = [str(args.tree.resolve() / "gateway"), str(args.tree.resolve() / "contract")]
    try:
        import uvloop
    except ImportError:  # asyncio's own loop then
        uvloop = None  # type: ignore[assignment]
    rows = (uvloop.run if uvloop else asyncio.run)(measure(args.samples))
    print(f"gateway of {args.tree}; {args.samples} samples each, median µs; "
          f"{'uvloop' if uvloop else 'asyncio'}")
    print(f"{'step':58s} {'cold':>7s} {'warm':>7s} {'cold/warm':>9s}")
    for name, cold, warm in rows:
        print(f"{name:58s} {cold:7.1f} {warm:7.1f} {cold / warm:9.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
