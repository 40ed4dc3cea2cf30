"""Placement rules for a box gateway: one broken repository per rule, with its rule id and position."""

from __future__ import annotations

from fleetllm.core.fleet.diagnostics import Severity
from tests.boxgateway.fleets import GATEWAY_PLACEMENT, gateway_fleet
from tests.fleet.helpers import FLEET, MODELS, only, validate


def test_a_gateway_box_is_valid_and_its_rows_need_not_be_listen_ports() -> None:
    fleet = gateway_fleet()
    box = fleet.boxes["203.0.113.10"]
    assert box.gateway_port == 8001
    assert [(r.model, r.port) for r in box.servers] == [("m1", 9001), ("m2", 9002)]


def test_a_box_without_gateway_has_none() -> None:
    result = validate()
    assert result.fleet is not None and result.fleet.boxes["203.0.113.10"].gateway_port is None


def test_gateway_port_must_be_a_listen_port() -> None:
    d = only(validate(placement=GATEWAY_PLACEMENT.replace("gateway: 8001", "gateway: 8080")), "gateway-not-listen")
    assert (d.line, d.column, d.pointer) == (3, 5, "/hosts/203.0.113.10/gateway")
    assert "8001, 8002, 8003" in d.message


def test_gateway_port_out_of_range_is_a_schema_error() -> None:
    result = validate(placement=GATEWAY_PLACEMENT.replace("gateway: 8001", "gateway: 70000"))
    assert [d.rule for d in result.diagnostics] == ["schema-maximum"] and result.diagnostics[0].line == 3


def test_a_row_on_the_gateway_port() -> None:
    d = only(validate(placement=GATEWAY_PLACEMENT.replace("[m2, 9002]", "[m2, 8001]")), "gateway-port-reused")
    assert (d.line, d.column, d.pointer) == (6, 14, "/hosts/203.0.113.10/servers/1/1")


def test_a_backend_port_below_1024() -> None:
    d = only(validate(placement=GATEWAY_PLACEMENT.replace("[m1, 9001]", "[m1, 80]")), "gateway-backend-port")
    assert (d.line, d.pointer) == (5, "/hosts/203.0.113.10/servers/0/1")


def test_backend_ports_must_still_differ() -> None:
    d = only(validate(placement=GATEWAY_PLACEMENT.replace("[m2, 9002]", "[m2, 9001]")), "duplicate-port")
    assert d.line == 6


def test_no_gateway_on_a_box_with_a_legacy_pair() -> None:
    fleet = FLEET + "legacy_servers:\n  - {host: 203.0.113.10, port: 8000}\n"
    d = only(validate(fleet=fleet, placement=GATEWAY_PLACEMENT.replace("[m2, 9002]", "[m2, 8000]")),
             "gateway-legacy")
    assert (d.line, d.pointer) == (6, "/hosts/203.0.113.10/servers/1/1")
    assert "203.0.113.10:8000 is a legacy pair" in d.message


def test_served_names_unique_behind_a_gateway() -> None:
    placement = GATEWAY_PLACEMENT + "      - [m1, 9003, m1-b]\n"
    d = only(validate(placement=placement), "gateway-duplicate-model")
    assert (d.line, d.column, d.pointer) == (7, 10, "/hosts/203.0.113.10/servers/2/0")
    assert "'m1'" in d.message


def test_two_recipes_with_one_served_name_behind_a_gateway() -> None:
    models = MODELS.replace("{model: org/m2,", "{served_model_name: m1, model: org/m2,")
    d = only(validate(models=models, placement=GATEWAY_PLACEMENT), "gateway-duplicate-model")
    assert d.line == 6


def test_the_same_rows_without_a_gateway_are_fine() -> None:
    placement = "hosts:\n  203.0.113.10:\n    - [m1, 8001]\n    - [m1, 8002, m1-b]\n"
    assert validate(placement=placement).valid


def test_process_name_gateway_is_reserved_on_a_gateway_box() -> None:
    d = only(validate(placement=GATEWAY_PLACEMENT.replace("[m2, 9002]", "[m2, 9002, gateway]")),
             "gateway-reserved-name")
    assert (d.line, d.column) == (6, 20)
    assert validate(placement="hosts:\n  203.0.113.10:\n    - [m1, 8001, gateway]\n").valid


def test_a_gateway_without_servers() -> None:
    placement = "hosts:\n  203.0.113.10:\n    gateway: 8001\n    servers: []\n"
    d = only(validate(placement=placement), "gateway-no-servers")
    assert (d.line, d.severity) == (3, Severity.ERROR)



def test_every_gateway_problem_is_reported_at_once() -> None:
    placement = (GATEWAY_PLACEMENT.replace("gateway: 8001", "gateway: 8080").replace("[m2, 9002]", "[m2, 80]")
                 + "      - [m1, 9003, gateway]\n")
    result = validate(placement=placement)
    assert sorted(d.rule for d in result.diagnostics) == [
        "gateway-backend-port", "gateway-duplicate-model", "gateway-not-listen", "gateway-reserved-name"]
