"""A box gets the compiled gateway from the real control plane: `fleetllm serve` with a directory of builds
(server.gateway_native) holding a real mypyc build of this checkout, vast.sh provisioning the box from it,
a real supervisord running the gateway, which says it runs compiled and routes a request to the stub
vLLM behind it with the bearer the control plane derived."""

from __future__ import annotations

import hashlib
import json
import urllib.request
from pathlib import Path

import pytest

from tests.installer.conftest import BOX, FLEET_KEY, free_port, write_fleet
from tests.installer.realprocs import Supervisor, http_status, wait_until
from tests.installer.test_control_plane_integration import get_json, provision_vast, serve_fleet
from tests.installer.test_units import parse_program
from tests.support.native import TAG, build_this_checkout, builds_directory
from tests.support.serve import require_serve

pytestmark = [pytest.mark.slow, pytest.mark.integration]


@pytest.fixture(autouse=True, scope="module")
def serve_works() -> None:
    require_serve()  # a broken `serve` fails these tests; it never skips them


def test_a_box_gets_and_runs_the_compiled_gateway_from_the_control_plane(
        tmp_path: Path, ports: list[int], supervisor: Supervisor, box_env: Path) -> None:
    builds = builds_directory(build_this_checkout(tmp_path / "scratch"), tmp_path / "builds")
    gateway_port = free_port()
    fleet = write_fleet(tmp_path / "fleet-git", [gateway_port], [("small", ports[0], None)], gateway=gateway_port)
    with serve_fleet(tmp_path, fleet, server=f"gateway_native: {builds}") as plane:
        done = provision_vast(plane)
        archive = urllib.request.urlopen(urllib.request.Request(
            f"{plane}/vllm/gateway-native/{TAG}", headers={"Authorization": f"Bearer {FLEET_KEY}"}), timeout=30).read()
        served = get_json(plane + "/vllm/config", FLEET_KEY, BOX)

    native = box_env / "fleetllm" / "gateway" / "native" / hashlib.sha256(archive).hexdigest()
    assert f"fetched the compiled gateway {native.name[:12]} for {TAG}" in done.stderr
    assert "; compiled modules)" in done.stderr  # the gateway's --check ran on it
    assert "1 server(s) and the box gateway (compiled) handed to supervisord (update)" in done.stderr
    program = parse_program(box_env.parent / "conf.d" / "fleetllm-gateway.conf")
    assert program.environment["FLEETLLM_GATEWAY_NATIVE"] == str(native)

    log = box_env / "fleetllm" / "logs" / "gateway.log"
    listening = wait_until("the gateway's listening line", lambda: next(
        (json.loads(line) for line in log.read_text().splitlines() if '"event":"listening"' in line), None)
        if log.exists() else None)
    assert listening["compiled"] is True
    assert supervisor.states()["fleetllm-gateway"] == "RUNNING"

    gateway = f"http://127.0.0.1:{gateway_port}"
    token = served["gateway"]["api_key"]
    wait_until("the model behind the gateway", lambda: http_status(gateway + "/v1/models", token) == 200, 120)
    request = urllib.request.Request(gateway + "/v1/models", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert [m["id"] for m in json.loads(answer.read())["data"]] == ["small"]
    assert http_status(gateway + "/v1/models") == 401
