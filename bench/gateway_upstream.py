"""A minimal, fast HTTP/1.1 upstream for the gateway benchmark (the role of LLMhop's Go upstream).

    python bench/gateway_upstream.py --tcp PORT --unix PATH [--sse-interval SECONDS]

Any request gets a 110-byte JSON answer with Content-Length, except `.../sse`, which streams
`SSE_EVENTS` events `--sse-interval` s apart (default SSE_INTERVAL), chunked, the first one at once.
Keep-alive, pipelining-safe.
Runs on uvloop when installed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib

BODY = b'{"id":"cmpl-bench","object":"chat.completion","model":"m","choices":[{"index":0,"text":"ok"}],"usage":{}}'
BODY = BODY.ljust(110)[:110]
RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%b" % (len(BODY), BODY)
SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
SSE_EVENTS = 3
SSE_INTERVAL = 0.05


class Upstream(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.Transport = transport  # type: ignore[assignment]
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[:end]
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if len(self.buffer) < end + 4 + length:
                return
            self.buffer = self.buffer[end + 4 + length:]
            target = head.split(b" ", 2)[1].split(b"?", 1)[0]
            if target.endswith(b"/sse"):
                asyncio.get_running_loop().create_task(self._sse())
            else:
                self.transport.write(RESPONSE)

    async def _sse(self) -> None:
        self.transport.write(SSE_HEAD)
        for index in range(SSE_EVENTS):
            if index:
                await asyncio.sleep(SSE_INTERVAL)
            event = b'data: {"n": %d}\n\n' % index
            self.transport.write(b"%x\r\n%b\r\n" % (len(event), event))
        self.transport.write(b"0\r\n\r\n")


async def main(tcp_port: int, unix_path: str) -> None:
    loop = asyncio.get_running_loop()
    servers = [await loop.create_server(Upstream, "127.0.0.1", tcp_port, backlog=1024)]
    if unix_path:
        servers.append(await loop.create_unix_server(Upstream, unix_path, backlog=1024))
    await asyncio.gather(*(server.serve_forever() for server in servers))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--tcp", type=int, required=True)
    parser.add_argument("--unix", default="")
    parser.add_argument("--sse-interval", type=float, default=SSE_INTERVAL,
                        help="seconds between two events of an SSE answer (default %(default)s)")
    args = parser.parse_args()
    SSE_INTERVAL = args.sse_interval
    try:
        import uvloop
    except ImportError:
        uvloop = None  # type: ignore[assignment]
    with contextlib.suppress(KeyboardInterrupt):
        (uvloop.run if uvloop else asyncio.run)(main(args.tcp, args.unix))
