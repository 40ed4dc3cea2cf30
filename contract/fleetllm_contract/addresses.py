"""Host and address helpers the box contract relies on, on both sides."""

from __future__ import annotations

import ipaddress


def normalise_host(host: str) -> str:
    """`::ffff:203.0.113.10` -> `203.0.113.10`; anything else unchanged (the contract's bearer input)."""
    lowered = host.lower()
    if lowered.startswith("::ffff:") and "." in lowered:
        return host[len("::ffff:"):]
    return host


def canonical_address(text: str) -> str:
    """An address in the form box names use (`2001:db8::1`, `203.0.113.10`); other text stripped only."""
    value = text.strip()
    if value.startswith("[") and value.endswith("]"):
        value = value[1:-1]
    value = normalise_host(value)
    try:
        address = ipaddress.ip_address(value)
    except ValueError:
        return value
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(address)


def is_loopback(host: str) -> bool:
    """`localhost` or a loopback address literal."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
