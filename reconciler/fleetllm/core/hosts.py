"""Which box a request is for: the box contract's precedence, as a pure function.

1. `X-LLMAO-Host`, when present, is the only key (no fallback: an unknown name is a 404).
2. Else the leftmost `X-Forwarded-For` address.
3. Else the TCP peer. IPv4-mapped IPv6 (`::ffff:a.b.c.d`) becomes `a.b.c.d` everywhere.

With `trusted_proxies` configured, X-Forwarded-For counts only when the TCP peer is a trusted proxy,
and the box is the rightmost address in it that is not a trusted proxy (entries left of that are
whatever the client wrote, so they prove nothing). Without it the contract's behaviour holds.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from fleetllm_contract.addresses import canonical_address

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class HostSource(StrEnum):
    CLAIMED = "x-llmao-host"
    FORWARDED = "x-forwarded-for"
    PEER = "peer"


@dataclass(frozen=True)
class ResolvedHost:
    name: str
    source: HostSource


def _trusted(address: str, networks: Sequence[IPNetwork]) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip.version == net.version and ip in net for net in networks)


def resolve_host(claimed: str | None, forwarded_for: str | None, peer: str,
                 trusted_proxies: Sequence[IPNetwork] = ()) -> ResolvedHost:
    if claimed is not None:
        return ResolvedHost(canonical_address(claimed), HostSource.CLAIMED)
    peer_address = canonical_address(peer)
    entries = [canonical_address(e) for e in (forwarded_for or "").split(",") if e.strip()]
    if entries:
        if not trusted_proxies:
            return ResolvedHost(entries[0], HostSource.FORWARDED)
        if _trusted(peer_address, trusted_proxies):
            client = next((e for e in reversed(entries) if not _trusted(e, trusted_proxies)), entries[0])
            return ResolvedHost(client, HostSource.FORWARDED)
    return ResolvedHost(peer_address, HostSource.PEER)
