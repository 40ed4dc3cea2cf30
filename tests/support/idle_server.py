"""An HTTP server that resets a kept-alive connection whose next request comes after it was idle for
`idle_close_s`: the moment a server's keep-alive timer closes a connection just as the client sends on
it (uvicorn, behind LiteLLM and vLLM, closes one idle for 5 s; the caller sees "Connection reset by
peer" before any answer). Every POST is answered with a small chat completion."""

from __future__ import annotations

import json
import select
import socket
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class _IdleClosingHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    idle_close_s = 5.0
    idle_since: float | None = None

    def log_message(self, format: str, *args: object) -> None:
        pass

    def handle_one_request(self) -> None:
        if self.idle_since is not None:
            select.select([self.connection], [], [])
            if time.monotonic() - self.idle_since >= self.idle_close_s:
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.close_connection = True
                return  # closed unread: a reset
        super().handle_one_request()
        self.idle_since = time.monotonic()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = json.dumps({"choices": [{"message": {"content": "hi"}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@contextmanager
def idle_closing_server(idle_close_s: float) -> Iterator[str]:
    """The server's base URL, on a loopback port, while the context lasts."""
    handler = type("IdleClosingHandler", (_IdleClosingHandler,), {"idle_close_s": idle_close_s})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
