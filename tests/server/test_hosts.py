"""Host resolution: the contract's precedence, as examples and as a property over header combinations."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator

import pytest
from flask import Flask
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetllm.core.hosts import HostSource, ResolvedHost, resolve_host
from fleetllm.server.app import create_app
from fleetllm.server.runtime import Runtime
from fleetllm_contract.addresses import canonical_address
from tests.server.conftest import FLEET_KEY

BOXES = ["203.0.113.10", "203.0.113.24", "k7v2m9x4q1w8e3", "198.51.100.23"]


@pytest.mark.parametrize(("text", "expected"), [
    ("::ffff:203.0.113.10", "203.0.113.10"),
    (" 203.0.113.10 ", "203.0.113.10"),
    ("2001:DB8::1", "2001:db8::1"),
    ("[2001:db8::1]", "2001:db8::1"),
    ("::ffff:cb00:710a", "203.0.113.10"),
    ("k7v2m9x4q1w8e3", "k7v2m9x4q1w8e3"),
    ("unknown", "unknown"),
])
def test_canonical_address(text: str, expected: str) -> None:
    assert canonical_address(text) == expected


def test_precedence_examples() -> None:
    assert resolve_host("box-a", "192.0.2.1", "192.0.2.2") == ResolvedHost("box-a", HostSource.CLAIMED)
    assert resolve_host(None, "192.0.2.1, 10.0.0.1", "192.0.2.2").name == "192.0.2.1"
    assert resolve_host(None, " , ", "::ffff:192.0.2.2").name == "192.0.2.2"
    assert resolve_host(None, None, "192.0.2.2").source is HostSource.PEER


def test_trusted_proxy_chain() -> None:
    trusted = [ipaddress.ip_network("10.0.0.0/8")]
    assert resolve_host(None, "1.1.1.1, 192.0.2.9, 10.0.0.5", "10.0.0.1", trusted).name == "192.0.2.9"
    assert resolve_host(None, "10.0.0.7, 10.0.0.5", "10.0.0.1", trusted).name == "10.0.0.7"
    assert resolve_host(None, "192.0.2.9", "192.0.2.1", trusted).source is HostSource.PEER


# Header values as a box, a proxy or an attacker might send them (printable ASCII, no CR/LF).
names = st.one_of(st.sampled_from(BOXES), st.from_regex(r"[ -~]{0,40}", fullmatch=True))
addresses = st.one_of(st.sampled_from([*BOXES[:2], "192.0.2.1", "::ffff:203.0.113.10", "2001:db8::5"]),
                      st.ip_addresses().map(str))
forwarded = st.lists(addresses, max_size=4).map(", ".join)
keys = st.one_of(st.none(), st.just(FLEET_KEY), st.from_regex(r"[!-~]{1,40}", fullmatch=True))
schemes = st.sampled_from(["Bearer", "bearer", "Basic", "Token"])


def expected_name(claimed: str | None, xff: str | None, peer: str) -> str:
    if claimed is not None:
        return canonical_address(claimed)
    entries = [e.strip() for e in (xff or "").split(",") if e.strip()]
    return canonical_address(entries[0] if entries else peer)


@pytest.fixture
def property_app(runtime: Runtime) -> Iterator[Flask]:
    return create_app(runtime)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(claimed=st.one_of(st.none(), names), xff=st.one_of(st.none(), forwarded), peer=addresses, key=keys,
       scheme=schemes)
def test_precedence_and_key_property(property_app: Flask, runtime: Runtime, claimed: str | None, xff: str | None,
                                     peer: str, key: str | None, scheme: str) -> None:
    headers = {}
    if claimed is not None:
        headers["X-LLMAO-Host"] = claimed
    if xff is not None:
        headers["X-Forwarded-For"] = xff
    if key is not None:
        headers["Authorization"] = f"{scheme} {key}"
    response = property_app.test_client().get("/vllm/config", headers=headers, environ_base={"REMOTE_ADDR": peer})
    right_key = key == FLEET_KEY and scheme.lower() == "bearer"
    if not right_key:
        assert response.status_code == 403
        return
    name = expected_name(claimed, xff, peer)
    assert resolve_host(claimed, xff, peer).name == name
    if name in BOXES:
        assert response.status_code == 200
        assert response.get_json()["host"] == name
    else:
        assert response.status_code == 404
        assert runtime.store.recent_fetches(limit=1)[0].box == name
