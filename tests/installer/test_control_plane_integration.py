"""The whole box path with the real control plane: a fleet in a real git repository, `fleetllm serve` as a
real process, vast.sh downloading the installer that server builds and serves, a real supervisord and
the stub vLLM answering with the bearer the control plane derived. The report lands in its state store.

Skipped while this checkout has no `fleetllm serve` (the control plane is built on another branch).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, TEST_SALT, git
from tests.installer.conftest import BOX, FLEET_KEY, free_port, write_fleet
from tests.installer.realprocs import Supervisor, http_status, wait_until
from tests.support.serve import require_serve

FLEETLLM = Path(sys.executable).parent / "fleetllm"
VIEWER_TOKEN = "viewer-token-for-tests-0001"


pytestmark = [pytest.mark.slow, pytest.mark.integration]


@pytest.fixture(autouse=True, scope="module")
def serve_works() -> None:
    require_serve()  # a broken `serve` fails these tests; it never skips them


def get_json(url: str, token: str, host: str | None = None) -> Any:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    if host:
        request.add_header("X-LLMAO-Host", host)
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


@contextlib.contextmanager
def serve_fleet(tmp_path: Path, fleet: Path, server: str = "") -> Iterator[str]:
    """`fleetllm serve` tracking `fleet` (made a git repository here), `server` added to its config's
    `server:` section; yields its base URL."""
    git(fleet, "init", "-q", "-b", "main")
    git(fleet, "add", "-A")
    git(fleet, "commit", "-q", "-m", "test fleet")
    port = free_port()
    config = tmp_path / "control-plane.yaml"
    config.write_text(f"""\
repo:
  path: {fleet}
  branch: main
secrets:
  fleet_key: ${{env:FLEETLLM_FLEET_KEY}}
  vllm_api_salt: ${{env:FLEETLLM_VLLM_API_SALT}}
listen: 127.0.0.1:{port}
state:
  url: sqlite:///{tmp_path}/state.sqlite3
viewer_tokens: ["${{env:FLEETLLM_VIEWER_TOKEN}}"]
""" + (f"server:\n  {server}\n" if server else ""))
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "FLEETLLM_FLEET_KEY": FLEET_KEY,
           "FLEETLLM_VLLM_API_SALT": TEST_SALT, "FLEETLLM_VIEWER_TOKEN": VIEWER_TOKEN}
    log = tmp_path / "serve.log"
    with log.open("wb") as output:
        process = subprocess.Popen([str(FLEETLLM), "serve", "--config", str(config)], env=env, cwd=tmp_path,
                                   stdout=output, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until("the control plane's /health", lambda: http_status(url + "/health") == 200 or (
            process.poll() is not None and pytest.fail(f"fleetllm serve ended: {log.read_text()[-3000:]}")), 120)
        yield url
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture
def real_plane(tmp_path: Path, ports: list[int]) -> Iterator[str]:
    """`fleetllm serve` tracking a real git repository of the test fleet; yields its base URL."""
    fleet = write_fleet(tmp_path / "fleet-git", ports, [("small", ports[0], None), ("large", ports[1], None)])
    with serve_fleet(tmp_path, fleet) as url:
        yield url


def provision_vast(url: str) -> subprocess.CompletedProcess[str]:
    """The Vast provisioning script against the control plane at `url`, as a box runs it."""
    env = {k: v for k, v in os.environ.items() if k != "LLMAO_HOST"}
    env.update({"FLEETLLM_URL": url, "PUBLIC_IPADDR": BOX, "FLEETLLM_PYTHON": sys.executable})
    done = subprocess.run(["bash", str(ROOT / "installer" / "fleetllm_installer" / "provision" / "vast.sh")], env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    return done


def test_vast_provisioning_against_the_real_control_plane(real_plane: str, supervisor: Supervisor,
                                                          box_env: Path) -> None:
    done = provision_vast(real_plane)
    assert "reported installed to the control plane" in done.stderr

    served = get_json(real_plane + "/vllm/config", FLEET_KEY, BOX)
    for server in served["servers"]:
        base = f"http://127.0.0.1:{server['port']}"
        wait_until(f"{server['name']} healthy", lambda b=base: http_status(b + "/health") == 200)
        assert http_status(base + "/v1/models", server["api_key"]) == 200  # the control plane's bearer
        assert http_status(base + "/v1/models") == 401
    assert set(supervisor.states()) == {"fleetllm-large", "fleetllm-small"}

    reports = get_json(real_plane + "/admin/reports", VIEWER_TOKEN)
    box = reports["boxes"][BOX]
    assert box["outcome"] == "installed"
    assert box["revision"] == served["revision"]
    assert box["staleness"]["stale"] is False  # the digests the box applied are the ones served
