"""Fixture upstreams for the conformance suite: a real HTTP/1.1 echo server (stdlib http.server) on TCP
or on a unix socket, with the endpoints of llmhop.md §12.

Every request is answered with JSON describing exactly what arrived: method, raw request target,
headers in order (duplicates kept), body (base64) and trailers. Special paths (matched on their end,
so they work under any base path):

    .../slow           sleep 1 s, then echo
    .../held           wait until the test's `holding()` block ends (at most HELD_S), then echo
    .../sse            text/event-stream, 3 events 0.5 s apart
    .../hop            a chunked response carrying hop-by-hop headers and a trailer
    .../big            a 2 MiB known-length body
    .../status/NNN     status NNN with an echo body
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import socket
import socketserver
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

HELD_S = 60.0  # the longest a `.../held` request waits: a test releases it long before
SSE_EVENTS = 3
SSE_INTERVAL = 0.5
BIG_SIZE = 2 * 1024 * 1024


_RELEASED = threading.Event()
_RELEASED.set()
_HELD_LOCK = threading.Lock()
HELD = {"now": 0, "most": 0}  # `.../held` requests in the upstreams now, and the most at once since reset_held()


def reset_held() -> None:
    with _HELD_LOCK:
        HELD["most"] = HELD["now"]


@contextlib.contextmanager
def holding() -> Iterator[None]:
    """`.../held` requests stay in flight upstream until the block ends: a test that needs requests
    holding the gateway's slots has them for as long as it needs, however slowly a loaded machine
    starts them (a fixed 1 s `.../slow` can end before the next request even arrives)."""
    _RELEASED.clear()
    try:
        yield
    finally:
        _RELEASED.set()


class EchoHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        return None

    def _read_body(self) -> tuple[bytes, list[list[str]]]:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            body, trailers = b"", []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while (line := self.rfile.readline().rstrip(b"\r\n")):
                        name, _, value = line.decode("latin-1").partition(":")
                        trailers.append([name, value.strip()])
                    return body, trailers
                body += self.rfile.read(size)
                self.rfile.read(2)
        length = int(self.headers.get("Content-Length", "0") or 0)
        return self.rfile.read(length), []

    def _handle(self) -> None:
        body, trailers = self._read_body()
        path = self.path.split("?", 1)[0]
        if path.endswith("/sse"):
            self._sse()
            return
        if path.endswith("/hop"):
            self._hop()
            return
        if path.endswith("/big"):
            self._send(200, b"x" * BIG_SIZE, "application/octet-stream")
            return
        if path.endswith("/slow"):
            time.sleep(1.0)
        if path.endswith("/held"):
            with _HELD_LOCK:
                HELD["now"] += 1
                HELD["most"] = max(HELD["most"], HELD["now"])
            try:
                _RELEASED.wait(HELD_S)
            finally:
                with _HELD_LOCK:
                    HELD["now"] -= 1
        status = 200
        if "/status/" in path:
            status = int(path.rsplit("/", 1)[1])
        echo = {"method": self.command, "path": self.path, "headers": [[k, v] for k, v in self.headers.items()],
                "body": base64.b64encode(body).decode(), "trailers": trailers,
                "backend": self.server.server_name_tag}  # type: ignore[attr-defined]
        self._send(status, json.dumps(echo).encode(), "application/json")

    def _send(self, status: int, data: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _sse(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for index in range(SSE_EVENTS):
            if index:
                time.sleep(SSE_INTERVAL)
            event = f"data: {{\"n\": {index}, \"t\": {time.time()}}}\n\n".encode()
            self.wfile.write(b"%x\r\n%b\r\n" % (len(event), event))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _hop(self) -> None:
        self.send_response(200)
        for name, value in (("Content-Type", "text/plain"), ("Connection", "X-Named-Hop"), ("X-Named-Hop", "1"),
                            ("Keep-Alive", "timeout=5"), ("Proxy-Authenticate", "Basic"), ("Upgrade", "h2c"),
                            ("Trailer", "X-Trailer"), ("Transfer-Encoding", "chunked"), ("X-Kept", "yes")):
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(b"5\r\nhello\r\n0\r\nX-Trailer: t\r\n\r\n")

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _handle  # noqa: N815


class _QuietAboutClosedClients:
    # vLLM's uvicorn listens with a backlog of 2048; socketserver's default of 5 drops SYNs when the
    # gateway opens 128 connections at once, and their retransmits (1 s, 3 s, 7 s, ...) hang a loaded run.
    request_queue_size = 2048

    def handle_error(self, request: Any, client_address: Any) -> None:
        """The gateway closing an upstream connection (a client went away) is expected here."""


class TCPEcho(_QuietAboutClosedClients, ThreadingHTTPServer):
    daemon_threads = True
    server_name_tag = "tcp"


class UnixEcho(_QuietAboutClosedClients, socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    server_name_tag = "unix"

    def get_request(self) -> Any:
        request, _ = super().get_request()
        return request, ("unix", 0)  # BaseHTTPRequestHandler wants a (host, port) client address


class Running:
    """A server running in a daemon thread until `stop()`."""

    def __init__(self, server: socketserver.BaseServer) -> None:
        self.server = server
        self.thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def start_tcp_echo() -> tuple[Running, int]:
    server = TCPEcho(("127.0.0.1", 0), EchoHandler)
    return Running(server), server.server_address[1]


def start_unix_echo(path: str) -> Running:
    if os.path.exists(path):
        os.unlink(path)
    return Running(UnixEcho(path, EchoHandler))


def start_tls_echo(cert: str, key: str) -> tuple[Running, int]:
    """The TCP echo behind TLS (a certificate for `localhost`)."""
    import ssl

    server = TCPEcho(("127.0.0.1", 0), EchoHandler)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    return Running(server), server.server_address[1]


class ForwardProxy(_QuietAboutClosedClients, socketserver.ThreadingTCPServer):
    """A forward proxy for the tests: CONNECT tunnels and absolute-form requests, each sent to
    127.0.0.1 at the requested port whatever host was named (so `echo.test:PORT` reaches the echo).
    `seen` records each connection's first line and its Proxy-Authorization."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _ProxyHandler)
        self.seen: list[tuple[str, str | None]] = []


class _ProxyHandler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        client = self.request
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = client.recv(65536)
            if not chunk:
                return
            head += chunk
        first, _, rest = head.partition(b"\r\n")
        method, target, _ = first.decode("latin-1").split(" ", 2)
        authorization = next((line.split(":", 1)[1].strip() for line in rest.decode("latin-1").split("\r\n")
                              if line.lower().startswith("proxy-authorization:")), None)
        self.server.seen.append((first.decode("latin-1"), authorization))  # type: ignore[attr-defined]
        authority = target if method == "CONNECT" else target.split("://", 1)[1].split("/", 1)[0]
        upstream = socket.create_connection(("127.0.0.1", int(authority.rsplit(":", 1)[1])))
        if method == "CONNECT":
            client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        else:
            upstream.sendall(head)
        pump = threading.Thread(target=_pipe, args=(upstream, client), daemon=True)
        pump.start()
        _pipe(client, upstream)
        pump.join(timeout=5)


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)


def start_proxy() -> tuple[Running, ForwardProxy, int]:
    proxy = ForwardProxy()
    return Running(proxy), proxy, proxy.server_address[1]
