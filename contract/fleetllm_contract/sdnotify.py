"""systemd's readiness protocol (sd_notify(3)) with the standard library: one datagram to $NOTIFY_SOCKET.

`fleetllm serve` under `Type=notify` (deploy/systemd/fleetllm-serve.service) sends READY=1 once its port
accepts connections and STOPPING=1 when SIGTERM starts its drain, so `systemctl start` returns, and units
ordered after it start, only when it serves; the box gateway (fleetllm_gateway.serve) sends the same
once it listens. Without $NOTIFY_SOCKET (any other supervisor, a container, a terminal) nothing is sent.
No dependency: the protocol is one unix datagram. It lives in the box contract because both sides use
it and the box packages do not import the control plane.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping


def notify_address(environ: Mapping[str, str] | None = None) -> str | None:
    """The socket to notify: $NOTIFY_SOCKET (a path, or @name in the abstract namespace), or None."""
    address = (os.environ if environ is None else environ).get("NOTIFY_SOCKET", "")
    if not address:
        return None
    return "\0" + address[1:] if address.startswith("@") else address


def sd_notify(state: str, environ: Mapping[str, str] | None = None) -> bool:
    """Send `state` ("READY=1", "STOPPING=1", "STATUS=...", newline-separated) to $NOTIFY_SOCKET.
    False when there is none; OSError when it cannot be reached (the caller logs it and carries on)."""
    address = notify_address(environ)
    if address is None:
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
        sock.connect(address)
        sock.sendall(state.encode())
    return True
