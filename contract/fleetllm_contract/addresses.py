"""Host and address helpers the box contract relies on, on both sides."""

from __future__ import annotations

import functools
import ipaddress

CACHED_CHARS = 64  # canonical_address remembers the answers for texts up to this long (a peer, a claim)


def normalise_host(host: str) -> str:
    """`::ffff:203.0.113.10` -> `203.0.113.10`; anything else unchanged (the contract's bearer input)."""
    lowered = host.lower()
    if lowered.startswith("::ffff:") and "." in lowered:
        return host[len("::ffff:"):]
    return host


def canonical_address(text: str) -> str:
    """An address in the form box names use (`2001:db8::1`, `203.0.113.10`); other text stripped only.
    The control plane asks this for every box request's peer and claim: short texts' answers are kept
    (at most 4,096 of CACHED_CHARS characters each, so a client sending new ones cannot grow it)."""
    return _canonical_cached(text) if len(text) <= CACHED_CHARS else _canonical(text)


@functools.lru_cache(maxsize=4096)
def _canonical_cached(text: str) -> str:
    return _canonical(text)


def _canonical(text: str) -> str:
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
