"""What the reconciler intends for a gateway box: every server reached through the gateway, with the
gateway's bearer, and the number of models the gateway must route (compared with its own /health)."""

from __future__ import annotations

from fleetllm.core.judge.intended import intended_state
from tests.boxgateway.fleets import BEARERS, BOX, gateway_fleet


def test_servers_behind_a_gateway_are_dialled_through_it() -> None:
    intended = intended_state(gateway_fleet(), BEARERS)
    servers = sorted(intended.servers.values(), key=lambda s: s.port)
    assert [(s.port, s.dial_port, s.gateway_models) for s in servers] == [(9001, 8001, 2), (9002, 8001, 2)]
    assert {s.bearer for s in servers} == {BEARERS.salt.derive(BOX, 8001)}


def test_boxes_without_a_gateway_have_no_count() -> None:
    plain = "hosts:\n  203.0.113.10:\n    - [m1, 8001]\n    - [m2, 8002]\n"
    intended = intended_state(gateway_fleet(plain), BEARERS)
    assert {s.gateway_models for s in intended.servers.values()} == {None}
