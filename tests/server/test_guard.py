"""The connection caps and the body budget of the HTTP server (reconciler/fleetllm/server/guard.py), as pure
bookkeeping; tests/faults/test_slow_connections.py drives them through the real server."""

from __future__ import annotations

import ipaddress

from fleetllm.server.guard import BodyBudget, ConnectionCaps, Refusal, body_share, is_exempt, peer_key, prefix_key

MIB = 1024 * 1024


def test_peer_key_counts_ipv4_addresses_and_ipv6_slash_64s() -> None:
    assert peer_key("192.0.2.7") == "192.0.2.7"
    assert peer_key("2001:db8:1:2:aaaa::1") == peer_key("2001:db8:1:2:bbbb::9") == "2001:db8:1:2::/64"
    assert peer_key("2001:db8:1:3::1") != peer_key("2001:db8:1:2::1")
    assert peer_key("::ffff:192.0.2.7") == "192.0.2.7"
    assert peer_key("fe80::1%eth0") == "fe80::/64"
    assert peer_key("not-an-address") == "not-an-address"


def test_per_peer_and_total_caps() -> None:
    caps = ConnectionCaps(max_total=5, max_per_peer=2, max_per_prefix=8)
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
    caps = ConnectionCaps(max_total=4, max_per_peer=1, max_per_prefix=4, exempt=proxies)
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


def test_one_network_cannot_hold_the_whole_total() -> None:
    """70 addresses of one /24 (or /64s of one IPv6 /48) hold at most max_per_prefix; other networks
    still get in."""
    caps = ConnectionCaps(max_total=1000, max_per_peer=4, max_per_prefix=16)
    admitted = [caps.admit(f"127.0.0.{i}") for i in range(1, 71) for _ in range(4)]
    assert admitted.count(None) == caps.max_per_prefix == 16
    assert Refusal.PER_PREFIX in admitted
    assert caps.admit("192.0.2.9") is None
    six = [caps.admit(f"2001:db8:7:{i:x}::1") for i in range(40) for _ in range(4)]
    assert six.count(None) == 16 and caps.admit("2001:db8:8::1") is None
    assert prefix_key("2001:db8:7:ab::1") == "2001:db8:7::/48" and prefix_key("::ffff:10.1.2.3") == "10.1.2.0/24"
    for i in range(1, 5):
        for _ in range(4):
            caps.release(f"127.0.0.{i}")
    assert caps.admit("127.0.0.70") is None  # released: the network has room again


def test_one_peer_cannot_fill_the_body_budget() -> None:
    budget = BodyBudget(total=64 * MIB, small=64 * 1024)
    shares = [budget.take(5 * MIB + 300 * 1024, "203.0.113.5") for _ in range(12)]
    assert shares.count(True) == 3 and budget.used <= budget.per_peer  # 16 MiB at most for one host
    assert budget.take(100 * 1024, "198.51.100.7")  # a webhook from elsewhere still gets its share
    budget.give_back(5 * MIB + 300 * 1024, "203.0.113.5")
    assert budget.take(5 * MIB + 300 * 1024, "203.0.113.5")
    proxies = BodyBudget(total=64 * MIB, small=64 * 1024, exempt=(ipaddress.ip_network("10.1.0.0/16"),))
    assert [proxies.take(8 * MIB, "10.1.0.1") for _ in range(8)] == [True] * 8  # a trusted proxy: the total only


def test_an_exempt_network_holds_more_than_the_network_cap_and_keeps_its_per_peer_cap() -> None:
    """server.network_cap_exempt: the listed /24 holds every peer's per-peer cap; an unlisted one only the
    network's allowance; the total still bounds both."""
    caps = ConnectionCaps(max_total=300, max_per_peer=2, max_per_prefix=8,
                          prefix_exempt=(ipaddress.ip_network("203.0.113.0/24"),))
    listed = [caps.admit(f"203.0.113.{i}") for i in range(1, 101) for _ in range(3)]
    assert listed.count(None) == 200  # 100 peers x 2: far beyond 8
    assert listed.count(Refusal.PER_PEER) == 100 and Refusal.PER_PREFIX not in listed
    unlisted = [caps.admit(f"198.51.100.{i}") for i in range(1, 101) for _ in range(2)]
    assert unlisted.count(None) == 8 and unlisted.count(Refusal.PER_PREFIX) == 192
    assert [caps.admit(f"192.0.{i}.1") for i in range(1, 101)].count(Refusal.TOTAL) == 8  # 300 in all
    for i in range(1, 101):
        caps.release(f"203.0.113.{i}")
        caps.release(f"203.0.113.{i}")
    assert caps.total == 100 and caps.admit("203.0.113.1") is None
