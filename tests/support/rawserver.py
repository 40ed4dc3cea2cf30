"""A raw-socket HTTP server for fault tests: it hands each request head to a function that may answer
anything, break HTTP, drip or cut the connection, the way an attacker on the path would."""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field


@dataclass
class RawServer:
    """Accepts connections on loopback and hands each to `answer(conn, request)` in a thread."""

    answer: Callable[[socket.socket, bytes], None]
    sock: socket.socket = field(default_factory=socket.socket)
    done: threading.Event = field(default_factory=threading.Event)  # set once a connection was answered
    tls: ssl.SSLContext | None = None  # speak TLS with this server context

    def start(self) -> RawServer:
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        threading.Thread(target=self._serve, daemon=True).start()
        return self

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.sock.getsockname()[1]}"

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        if self.tls is not None:
            try:
                conn = self.tls.wrap_socket(conn, server_side=True)
            except OSError:
                conn.close()
                return
        with conn:
            request = b""
            while b"\r\n\r\n" not in request:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                request += chunk
            with contextlib.suppress(OSError):
                self.answer(conn, request)
        self.done.set()

    def stop(self) -> None:
        self.sock.close()


@contextlib.contextmanager
def serving(answer: Callable[[socket.socket, bytes], None], tls: ssl.SSLContext | None = None) -> Iterator[RawServer]:
    server = RawServer(answer, tls=tls).start()
    try:
        yield server
    finally:
        server.stop()
