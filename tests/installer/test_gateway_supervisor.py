"""A gateway box for real: the installer, a real supervisord, the stub vLLM on loopback ports and the
real gateway process run from the box program (zipapp) the installer copied.

The gateway listens on 127.0.0.2 (FLEETLLM_LISTEN_HOST, standing in for a public address) and the
servers on 127.0.0.1, as the box JSON says, so a test can tell the two apart.
"""

from __future__ import annotations

import json
import os
import stat
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from fleetllm_installer.main import main
from tests.installer.conftest import BOX, FakeControlPlane, render, write_fleet
from tests.installer.realprocs import Supervisor, http_status, pid_alive, wait_until
from tests.support.ports import free_ports

pytestmark = pytest.mark.slow
PUBLIC = "127.0.0.2"


def gateway_box(directory: Path, ports: list[int], gateway: int) -> dict[str, Any]:
    return render(write_fleet(directory, [gateway], [("small", ports[0], None), ("large", ports[1], None)],
                              gateway=gateway))


@pytest.fixture
def plane(control_plane: FakeControlPlane, monkeypatch: pytest.MonkeyPatch) -> FakeControlPlane:
    monkeypatch.setenv("FLEETLLM_URL", control_plane.url)
    monkeypatch.setenv("FLEETLLM_LISTEN_HOST", PUBLIC)
    return control_plane


def chat(base: str, bearer: str, model: str) -> tuple[int, Any]:
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hello"}]}).encode()
    request = urllib.request.Request(f"{base}/v1/chat/completions", data=body, method="POST",
                                     headers={"Authorization": f"Bearer {bearer}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status), json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return int(exc.code), json.loads(exc.read() or b"null")


def get_json(url: str, bearer: str | None = None) -> Any:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {bearer}"} if bearer else {})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def healthy(port: int, host: str = "127.0.0.1") -> bool:
    return http_status(f"http://{host}:{port}/health") == 200


def wait_serving(doc: dict[str, Any], host: str = "127.0.0.1") -> None:
    wait_until("both servers healthy", lambda: all(healthy(s["port"], host) for s in doc["servers"]))
    if "gateway" in doc:
        wait_until("the gateway's /health", lambda: healthy(doc["gateway"]["port"], PUBLIC))


def cmdlines() -> list[bytes]:
    found = []
    for path in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            found.append(path.read_bytes())
        except OSError:
            continue
    return found


def test_the_gateway_serves_every_model_of_the_box_with_one_bearer(supervisor: Supervisor, plane: FakeControlPlane,
                                                                     tmp_path: Path, ports: list[int]) -> None:
    gateway_port, = free_ports("127.0.0.1", avoid=ports)
    doc = plane.boxes[BOX] = gateway_box(tmp_path / "gw", ports, gateway_port)
    token = doc["gateway"]["api_key"]
    assert main(["--handover", "update"]) == 0
    wait_serving(doc)
    base = f"http://{PUBLIC}:{gateway_port}"
    wait_until("every program RUNNING", lambda: set(supervisor.states().values()) == {"RUNNING"})
    assert set(supervisor.states()) == {"fleetllm-gateway", "fleetllm-large", "fleetllm-small"}

    # /health counts the models without a bearer; each model answers through the gateway from its own stub.
    assert get_json(f"{base}/health") == {"status": "ok", "models": 2}
    for server in doc["servers"]:
        status, answer = chat(base, token, server["served_model_name"])
        assert status == 200, answer
        assert answer["choices"][0]["message"]["content"] == (
            f"stub-vllm {server['served_model_name']} port {server['port']}: hello")
    assert {m["id"] for m in get_json(f"{base}/v1/models", token)["data"]} == {"small", "large"}

    # One bearer at the gateway, the servers' own behind it: neither opens the other's door.
    assert chat(base, "sk-vllm-wrong", "small")[0] == 401
    assert chat(base, doc["servers"][0]["api_key"], "small")[0] == 401
    small = next(s for s in doc["servers"] if s["name"] == "small")
    assert chat(f"http://127.0.0.1:{small['port']}", token, "small")[0] == 401
    assert chat(f"http://127.0.0.1:{small['port']}", small["api_key"], "small")[0] == 200

    # The servers bind loopback only; the gateway binds the listen host, not loopback.
    for event in (e for e in supervisor.read_events() if e["event"] == "start"):
        argv = event["argv"]
        assert argv[argv.index("--host") + 1] == "127.0.0.1"
    assert not healthy(small["port"], PUBLIC)
    assert http_status(f"http://127.0.0.1:{gateway_port}/health") is None

    # No bearer on any command line; the credentials are private files.
    secrets = [token.encode(), *(s["api_key"].encode() for s in doc["servers"])]
    for cmdline in cmdlines():
        assert not any(secret in cmdline for secret in secrets)
    credentials = Path(os.environ["FLEETLLM_DATA_DIR"]) / "fleetllm" / "gateway" / "credentials"
    assert sorted(p.name for p in credentials.iterdir()) == ["bearer-large", "bearer-small", "client-token"]
    assert {stat.S_IMODE(p.stat().st_mode) for p in credentials.iterdir()} == {0o600}

    (report,) = plane.reports
    assert report["outcome"] == "installed"
    assert report["gateway"] == {"port": gateway_port, "digest": doc["gateway"]["digest"],
                                 "unit": "fleetllm-gateway", "state": "started"}
    assert {s["state"] for s in report["servers"]} == {"started"}


def gateway_pid(supervisor: Supervisor) -> int:
    return supervisor.pid("fleetllm-gateway")


def test_moving_the_gateway_keeps_the_servers_and_removing_it_publishes_them(
        supervisor: Supervisor, plane: FakeControlPlane, tmp_path: Path, ports: list[int]) -> None:
    first, second = free_ports("127.0.0.1", "127.0.0.1")
    doc = plane.boxes[BOX] = gateway_box(tmp_path / "gw1", ports, first)
    assert main(["--handover", "update"]) == 0
    wait_serving(doc)
    server_pids = {s["name"]: supervisor.pids(s["port"]) for s in doc["servers"]}
    old_gateway = gateway_pid(supervisor)

    # The gateway moves to another port: only the gateway restarts; the servers' digests did not change.
    moved = plane.boxes[BOX] = gateway_box(tmp_path / "gw2", ports, second)
    assert [s["digest"] for s in moved["servers"]] == [s["digest"] for s in doc["servers"]]
    assert main(["--handover", "update"]) == 0
    wait_serving(moved)
    assert chat(f"http://{PUBLIC}:{second}", moved["gateway"]["api_key"], "large")[0] == 200
    wait_until("the old gateway stopped", lambda: not pid_alive(old_gateway))
    assert http_status(f"http://{PUBLIC}:{first}/health") is None
    assert {s["name"]: supervisor.pids(s["port"]) for s in moved["servers"]} == server_pids

    # No gateway any more: the servers restart on the listen host, the gateway and its bearers go.
    plain = plane.boxes[BOX] = render(write_fleet(tmp_path / "plain", ports[:2],
                                                  [("small", ports[0], None), ("large", ports[1], None)]))
    assert main(["--handover", "update"]) == 0
    wait_until("fleetllm-gateway gone", lambda: "fleetllm-gateway" not in supervisor.states())
    wait_serving(plain, PUBLIC)
    assert http_status(f"http://{PUBLIC}:{second}/health") is None
    assert plane.reports[-1]["units_removed"] == ["fleetllm-gateway"]
    credentials = Path(os.environ["FLEETLLM_DATA_DIR"]) / "fleetllm" / "gateway" / "credentials"
    assert list(credentials.iterdir()) == []
    for name, pids in server_pids.items():
        assert all(not pid_alive(pid) for pid in pids), name
