"""`fleetllm diff` on gateway changes: a gateway added, moved or removed is a boot change of its box."""

from __future__ import annotations

from fleetllm.core.diff.compute import diff_fleets
from fleetllm.core.diff.report import BoxStatus, Lifetime
from fleetllm.core.diff.sections import box_verdict
from tests.boxgateway.fleets import GATEWAY_PLACEMENT, gateway_fleet

MOVED = GATEWAY_PLACEMENT.replace("gateway: 8001", "gateway: 8003")
WITHOUT = GATEWAY_PLACEMENT.replace("    gateway: 8001\n", "").replace("9001]", "8001]").replace("9002]", "8002]")


def test_a_moved_gateway_restarts_only_the_gateway() -> None:
    report = diff_fleets(gateway_fleet(), gateway_fleet(MOVED))
    (box,) = report.boxes
    assert box.status is BoxStatus.RESTART and (box.start, box.restart, box.stop) == ((), (), ())
    (detail,) = box.details
    assert (detail.path, detail.before, detail.after, detail.lifetime) == (("gateway",), 8001, 8003, Lifetime.BOOT)
    assert box_verdict(box) == "box 203.0.113.10 must re-fetch its config and restart its gateway"
    assert report.servers == ()
    # Every deployment now presents the gateway's new bearer.
    assert {d.fields[0].after for d in report.deployments} == {"derived from 203.0.113.10:8003 (the box gateway)"}


def test_a_removed_gateway_puts_the_servers_back_on_listen_ports() -> None:
    report = diff_fleets(gateway_fleet(), gateway_fleet(WITHOUT))
    (box,) = report.boxes
    assert box.status is BoxStatus.RESTART
    (detail,) = box.details
    assert (detail.path, detail.before, detail.lifetime) == (("gateway",), 8001, Lifetime.BOOT)
    assert "its gateway" in box_verdict(box)
    assert {c.action for c in report.servers} == {"move"}
    assert {d.action for d in report.deployments} == {"create", "delete"}  # new (box, port) identities


def test_an_unchanged_gateway_box_has_no_changes() -> None:
    assert not diff_fleets(gateway_fleet(), gateway_fleet()).changed
