"""Free loopback ports for tests that need several at once.

`free_port()` binds port 0, reads the number and closes the socket, so the port is free again: a second
call can return the same number (on this machine about 1 pair in 20,000), and a fleet whose two servers
got the same port is refused ("port ... is already used ... [duplicate-port]"). `free_ports()` keeps
every socket bound until all the ports are chosen, and draws again a number already chosen for another
address, so the ports it returns are all different."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Collection


def free_ports(*hosts: str, avoid: Collection[int] = ()) -> list[int]:
    """One free port on each of `hosts` (a host may repeat), all different numbers and none in `avoid`
    (ports already handed out that nothing listens on yet)."""
    chosen: list[int] = []
    with contextlib.ExitStack() as held:
        for host in hosts:
            while True:
                sock = held.enter_context(socket.socket())
                sock.bind((host, 0))
                port = int(sock.getsockname()[1])
                if port not in chosen and port not in avoid:
                    break
            chosen.append(port)
    return chosen
