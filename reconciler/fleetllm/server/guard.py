"""What a connection may hold, as pure bookkeeping: connections per peer and in all, and request-body
bytes buffered at once. The HTTP server (reconciler/fleetllm/server/httpserver.py) asks before it admits a
connection or starts buffering a large body; nothing here does I/O or reads a clock.

A peer is an IPv4 address, or an IPv6 /64 (one host usually owns a whole /64, so counting single IPv6
addresses would cap nothing). Peers in `exempt` (the configured trusted proxies, which carry many
boxes on few connections' addresses) count toward the total only.

One host often owns more than one peer (an IPv4 /24 of addresses, an IPv6 /48 of /64s): a network
prefix (IPv4 /24, IPv6 /48) may hold at most `max_per_prefix` connections (server.max_connections_per_network,
4 peers' worth at the defaults), so 70 addresses of one network cannot hold the whole total. Peers in
`prefix_exempt` (server.network_cap_exempt: a provider's NAT, a boot storm of many boxes in one /24) are
not counted per network; they keep their per-peer cap. And one peer may hold at most PEER_BODY_SHARE of the body
budget, so a few connections declaring large bodies from one host cannot starve everyone's uploads.
"""

from __future__ import annotations

import ipaddress
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class Refusal(StrEnum):
    PER_PEER = "per_peer"  # the peer already holds max_connections_per_peer
    PER_PREFIX = "per_prefix"  # its network (IPv4 /24, IPv6 /48) already holds max_per_prefix
    TOTAL = "total"  # the server already holds max_connections
    BODY_BUDGET = "body_budget"  # large bodies being buffered already fill the budget


PEER_BODY_SHARE = 4  # one peer holds at most 1/PEER_BODY_SHARE of the body budget


def _ip(address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address (an IPv4-mapped IPv6 one as IPv4, a zone dropped), or None when it is not one."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def prefix_key(address: str) -> str:
    """The network a peer belongs to: the IPv4 /24, or the IPv6 /48 (an IPv4-mapped address as IPv4)."""
    ip = _ip(address)
    if ip is None:
        return address
    return str(ipaddress.ip_network((ip, 24 if ip.version == 4 else 48), strict=False))


def peer_key(address: str) -> str:
    """The unit a cap counts: the IPv4 address, or the IPv6 /64 (an IPv4-mapped address as IPv4)."""
    ip = _ip(address)
    if ip is None:
        return address
    return str(ip) if ip.version == 4 else str(ipaddress.IPv6Network((ip, 64), strict=False))


def is_exempt(address: str, exempt: Sequence[IPNetwork]) -> bool:
    ip = _ip(address)
    return ip is not None and any(ip in network for network in exempt)


@dataclass
class ConnectionCaps:
    """Open connections, per peer, per network prefix and in all. `admit` then, once the connection is
    gone, `release`. `exempt`: counted in the total only; `prefix_exempt`: not counted per network."""

    max_total: int
    max_per_peer: int
    max_per_prefix: int
    exempt: Sequence[IPNetwork] = ()
    prefix_exempt: Sequence[IPNetwork] = ()

    def __post_init__(self) -> None:
        self._per_peer: dict[str, int] = {}
        self._per_prefix: dict[str, int] = {}
        self._total = 0
        self._lock = threading.Lock()

    @property
    def total(self) -> int:
        return self._total

    def held_by(self, address: str) -> int:
        return self._per_peer.get(peer_key(address), 0)

    @property
    def peers(self) -> int:
        return len(self._per_peer)

    def admit(self, address: str) -> Refusal | None:
        """Count the connection in and return None, or return why it is refused (nothing counted)."""
        key = peer_key(address)
        with self._lock:
            if self._total >= self.max_total:
                return Refusal.TOTAL
            if not is_exempt(address, self.exempt):
                held = self._per_peer.get(key, 0)
                if held >= self.max_per_peer:
                    return Refusal.PER_PEER
                prefix = None if is_exempt(address, self.prefix_exempt) else prefix_key(address)
                network = self._per_prefix.get(prefix, 0) if prefix is not None else 0
                if prefix is not None and network >= self.max_per_prefix:
                    return Refusal.PER_PREFIX
                self._per_peer[key] = held + 1
                if prefix is not None:
                    self._per_prefix[prefix] = network + 1
            self._total += 1
            return None

    def release(self, address: str) -> None:
        key = peer_key(address)
        with self._lock:
            self._total = max(0, self._total - 1)
            held = self._per_peer.get(key)
            if held is not None:  # exempt peers were never counted
                if held <= 1:
                    del self._per_peer[key]
                else:
                    self._per_peer[key] = held - 1
                if is_exempt(address, self.prefix_exempt):
                    return  # never counted per network
                prefix = prefix_key(address)
                network = self._per_prefix.get(prefix, 0)
                if network <= 1:
                    self._per_prefix.pop(prefix, None)
                else:
                    self._per_prefix[prefix] = network - 1


@dataclass
class BodyBudget:
    """Bytes of large request bodies buffered at once, over every connection, and per peer (at most
    1/PEER_BODY_SHARE of the total, exempt peers excepted). Bodies up to `small` bytes (declared by
    Content-Length) need no share: max_connections of them are the bound there."""

    total: int
    small: int
    exempt: Sequence[IPNetwork] = ()

    def __post_init__(self) -> None:
        self._used = 0
        self._per_peer: dict[str, int] = {}
        self._lock = threading.Lock()

    @property
    def used(self) -> int:
        return self._used

    @property
    def per_peer(self) -> int:
        return self.total // PEER_BODY_SHARE

    def take(self, size: int, address: str = "") -> bool:
        key = peer_key(address) if address and not is_exempt(address, self.exempt) else None
        with self._lock:
            if self._used + size > self.total:
                return False
            if key is not None:
                mine = self._per_peer.get(key, 0)
                if mine + size > max(self.per_peer, self.small):
                    return False
                self._per_peer[key] = mine + size
            self._used += size
            return True

    def give_back(self, size: int, address: str = "") -> None:
        key = peer_key(address) if address and not is_exempt(address, self.exempt) else None
        with self._lock:
            self._used = max(0, self._used - size)
            if key is not None and key in self._per_peer:
                left = self._per_peer[key] - size
                if left > 0:
                    self._per_peer[key] = left
                else:
                    del self._per_peer[key]


def body_share(content_length: str | None, chunked: bool, path_cap: int, small: int) -> int:
    """How many bytes of the budget a request must hold while its body is read: 0 for a small declared
    body, else the declared length (at most `path_cap`; a larger one is refused by its length alone),
    or `path_cap` for a chunked body whose size is not known up front."""
    if chunked:
        return path_cap
    if content_length is None:
        return 0
    try:
        declared = int(content_length.strip())
    except ValueError:
        return 0  # the HTTP parser refuses it with 400
    if declared <= small:
        return 0
    return min(declared, path_cap)
