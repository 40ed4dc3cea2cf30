"""One request's overall deadline for urllib clients (standard library only): the box's installer and
agent (fleetllm_installer.fetch) and the reconciler's clients that carry a secret
(fleetllm.adapters.outgoing). A socket timeout bounds each read; this bounds the whole request, so a
server that drips one byte at a time cannot hold a caller past it."""

from __future__ import annotations

import contextlib
import http.client
import socket
import threading
from typing import Any

__all__ = ["Watchdog", "watched"]


class Watchdog:
    """One request's overall deadline. Every socket the request opens is registered (a duplicate of its
    descriptor, so it stays valid after TLS takes the socket over); at the deadline a timer thread shuts
    them down, and whatever blocks on them (connect, handshake, a read) returns at once with an error.
    close() cancels the timer and lets go of the duplicates; call it when the request ends."""

    def __init__(self, seconds: float) -> None:
        self.expired = False
        self._closed = False
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def watch(self, sock: socket.socket) -> None:
        duplicate = sock.dup()
        with self._lock:
            if self._closed:
                duplicate.close()
                return
            self._sockets.append(duplicate)
            if self.expired:
                _shut(duplicate)

    def _expire(self) -> None:
        with self._lock:
            if self._closed:
                return
            self.expired = True
            for sock in self._sockets:
                _shut(sock)

    def close(self) -> None:
        self._timer.cancel()
        with self._lock:
            self._closed = True
            for sock in self._sockets:
                sock.close()
            self._sockets.clear()


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):  # already closed by the peer
        sock.shutdown(socket.SHUT_RDWR)


def watched(connection_class: type[http.client.HTTPConnection], watchdog: Watchdog) -> Any:
    """A factory of `connection_class` whose every socket (to the server, or to a proxy) the watchdog
    watches, for urllib's `do_open`."""

    def connect(address: tuple[str, int], timeout: float | None = None,
                source_address: tuple[str, int] | None = None) -> socket.socket:
        sock = socket.create_connection(address, timeout, source_address)
        watchdog.watch(sock)
        return sock

    def make(*args: Any, **kwargs: Any) -> http.client.HTTPConnection:
        connection = connection_class(*args, **kwargs)
        connection._create_connection = connect  # type: ignore[attr-defined]  # http.client's own seam
        return connection

    return make
