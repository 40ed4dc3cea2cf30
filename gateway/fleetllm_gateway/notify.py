"""sd_notify: tell systemd (or anything listening on $NOTIFY_SOCKET) that the gateway is ready."""

from __future__ import annotations

import os
import socket


def sd_notify(state: str, environ: dict[str, str] | None = None) -> bool:
    """Send `state` (e.g. "READY=1") to $NOTIFY_SOCKET; False when there is none. Errors propagate."""
    address = (os.environ if environ is None else environ).get("NOTIFY_SOCKET", "")
    if not address:
        return False
    if address.startswith("@"):  # abstract namespace
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
        sock.connect(address)
        sock.sendall(state.encode())
    return True
