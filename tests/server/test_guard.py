"""The connection caps and the body budget of the HTTP server (reconciler/fleetllm/server/guard.py), as pure
bookkeeping; tests/faults/test_slow_connections.py drives them through the real server."""

from __future__ import annotations

import ipaddress

from fleetllm.server.guard import BodyBudget, ConnectionCaps, Refusal, body_share, is_exempt, peer_key


def test_peer_key_counts_ipv4_addresses_and_ipv6_slash_64s() -> None:
    assert peer_key("192.0.2.7") == "192.0.2.7"
    assert peer_key("2001:db8:1:2:aaaa::1") == peer_key("2001:db8:1:2:bbbb::9") == "2001:db8:1:2::/64"
    assert peer_key("2001:db8:1:3::1") != peer_key("2001:db8:1:2::1")
    assert peer_key("::ffff:192.0.2.7") == "192.0.2.7"
    assert peer_key("fe80::1%eth0") == "fe80::/64"
    assert peer_key("not-an-address") == "not-an-address"


def test_per_peer_and_total_caps() -> None:
    caps = ConnectionCaps(max_total=5, max_per_peer=2)
    assert caps.admit("10.0.0.1") is None
    assert caps.admit("10.0.0.1") is None
    assert caps.admit("10.0.0.1") is Refusal.PER_PEER
    assert caps.held_by("10.0.0.1") == 2
    assert caps.admit("10.0.0.2") is None
    assert caps.admit("10.0.0.3") is None
    assert caps.admit("10.0.0.4") is None
    assert caps.total == 5
    assert caps.admit("10.0.0.5") is Refusal.TOTAL
    caps.release("10.0.0.1")
    assert caps.admit("10.0.0.1") is None  # a released slot is free again
    for peer in ("10.0.0.1", "10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"):
        caps.release(peer)
    assert caps.total == 0
    assert caps.peers == 0


def test_trusted_proxies_count_toward_the_total_only() -> None:
    proxies = (ipaddress.ip_network("10.1.0.0/16"),)
    caps = ConnectionCaps(max_total=4, max_per_peer=1, exempt=proxies)
    assert is_exempt("10.1.2.3", proxies)
    assert not is_exempt("10.2.0.1", proxies)
    assert [caps.admit("10.1.2.3") for _ in range(3)] == [None, None, None]
    assert caps.admit("10.1.2.3") is None
    assert caps.admit("10.1.2.3") is Refusal.TOTAL
    caps.release("10.1.2.3")
    assert caps.total == 3
    assert caps.peers == 0


def test_body_budget_and_shares() -> None:
    small, cap = 64 * 1024, 1024 * 1024
    assert body_share(None, False, cap, small) == 0
    assert body_share("100", False, cap, small) == 0
    assert body_share(str(small), False, cap, small) == 0
    assert body_share(str(small + 1), False, cap, small) == small + 1
    assert body_share(str(10 * cap), False, cap, small) == cap  # refused by its length anyway
    assert body_share(None, True, cap, small) == cap  # chunked: its size is not known up front
    assert body_share("12x", False, cap, small) == 0
    budget = BodyBudget(total=2 * cap, small=small)
    assert budget.take(cap)
    assert budget.take(cap)
    assert not budget.take(1)
    budget.give_back(cap)
    assert budget.used == cap
    assert budget.take(cap // 2)
