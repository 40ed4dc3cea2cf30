"""The whole fleet with real parts: a fleet git repository; `fleetllm serve` (the control plane) as a
process; per box, vast.sh fetching the installer from it, the installer writing units for a real
supervisord that runs the stub vLLM on that box's loopback address (127.0.0.2, 127.0.0.3, static
provider); `fleetllm plan`/`apply` processes sharing the control plane's config and state file; the
real LiteLLM proxy. A chat completion sent through LiteLLM reaches the right stub; moving a model in a
new commit moves its deployment; a stopped server goes Down and loses its deployment; started again,
it gets it back."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetllm.core.fleet.bearer import Salt
from tests.conftest import git
from tests.installer.realprocs import http_status, wait_until
from tests.support.box import Box
from tests.support.litellm import LitellmProxy
from tests.support.ports import free_ports
from tests.support.serve import require_serve

from .fakes import free_port

FLEETLLM = Path(sys.executable).parent / "fleetllm"
SALT = "full-loop-salt-0123456789"
FLEET_KEY = "full-loop-fleet-key-0001"
BOXES = ("127.0.0.2", "127.0.0.3")


pytestmark = [pytest.mark.slow, pytest.mark.integration]


@pytest.fixture(autouse=True, scope="module")
def serve_works() -> None:
    require_serve()  # a broken `serve` fails these tests; it never skips them


def write_fleet(repo: Path, ports: list[int], placement: dict[str, list[tuple[str, int]]]) -> None:
    (repo / "fleet.yaml").write_text(
        "version: 1\nfleet_id: test-fleet\n"
        f"listen_ports: [{', '.join(str(p) for p in ports)}]\n"
        "reconcile:\n  health_grace_s: 600\n  probe_timeout_s: 2\n  down_after_failures: 2\n"
        "  up_after_successes: 2\n  max_deletes_per_pass: 10\n  max_delete_fraction: 1.0\n"
        "rollout: {mode: manual}\n")  # the manual procedure (boxes restarted by hand); rollouts: tests/demo
    (repo / "models.yaml").write_text(
        "models:\n"
        "  tiny-a:\n    vllm: {model: org/tiny-a, max_model_len: 4096, vram_gb: 2, disk_gb: 1}\n"
        "  tiny-b:\n    vllm: {model: org/tiny-b, max_model_len: 4096, vram_gb: 2, disk_gb: 1}\n")
    lines = ["hosts:"]
    for box, rows in placement.items():
        lines += [f"  {box}:", "    provider: static", "    servers:"]
        lines.extend(f"      - [{model}, {port}]" for model, port in rows)
    (repo / "placement.yaml").write_text("\n".join(lines) + "\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "fleet change")


@pytest.fixture
def boxes(tmp_path: Path) -> Iterator[dict[str, Box]]:
    made: dict[str, Box] = {}
    try:
        for name in BOXES:
            made[name] = Box(name, tmp_path / f"box-{name}")
        yield made
    finally:
        for box in made.values():
            box.stop()


def chat(proxy: LitellmProxy, model: str) -> str:
    request = urllib.request.Request(proxy.url.rstrip("/") + "/v1/chat/completions", method="POST",
                                     data=json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]
                                                      }).encode(),
                                     headers={"Authorization": f"Bearer {proxy.master_key}",
                                              "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return str(json.loads(response.read())["choices"][0]["message"]["content"])


def managed(proxy: LitellmProxy) -> dict[str, str]:
    return {r["model_info"]["id"]: r["model_name"] for r in proxy.deployments()
            if r["model_info"].get("managed_by") == "fleetllm"}


def test_full_loop(litellm: LitellmProxy, boxes: dict[str, Box], tmp_path: Path) -> None:
    p1, p2, p3 = free_ports("127.0.0.2", "127.0.0.3", "127.0.0.3")
    ports = [p1, p2, p3]
    repo = tmp_path / "fleet"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    write_fleet(repo, ports, {"127.0.0.2": [("tiny-a", p1)], "127.0.0.3": [("tiny-b", p2)]})
    plane_port = free_port()
    plane = f"http://127.0.0.1:{plane_port}"
    config = tmp_path / "control-plane.yaml"
    config.write_text(f"""\
repo:
  path: {repo}
  branch: main
  refresh_interval_s: 1
secrets:
  fleet_key: ${{env:FL_FLEET_KEY}}
  vllm_api_salt: ${{env:FL_SALT}}
listen: 127.0.0.1:{plane_port}
state:
  url: sqlite:///{tmp_path}/state.sqlite3
litellm:
  url: {litellm.url}
  master_key: ${{env:FL_LITELLM_KEY}}
providers:
  static: {{}}
""")
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "FL_FLEET_KEY": FLEET_KEY, "FL_SALT": SALT,
           "FL_LITELLM_KEY": litellm.master_key}
    server = subprocess.Popen([str(FLEETLLM), "serve", "--config", str(config)], env=env, cwd=tmp_path,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def fleetllm(*args: str) -> tuple[int, str]:
        done = subprocess.run([str(FLEETLLM), *args, "--config", str(config)], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=180, check=False)
        return done.returncode, done.stdout + done.stderr

    salt = Salt(SALT)
    ida1, idb2, ida3 = f"fleetllm:127.0.0.2:{p1}", f"fleetllm:127.0.0.3:{p2}", f"fleetllm:127.0.0.3:{p3}"
    try:
        wait_until("the control plane's /health", lambda: http_status(plane + "/health") == 200, 120)

        code, out = fleetllm("plan", "--detailed-exitcode")
        assert code == 0, out
        assert "Pending" in out
        assert "never fetched its config" in out

        for box in boxes.values():
            done = box.provision(plane, FLEET_KEY)
            assert done.returncode == 0, done.stderr
        wait_until("tiny-a healthy", lambda: http_status(f"http://127.0.0.2:{p1}/health") == 200)
        wait_until("tiny-b healthy", lambda: http_status(f"http://127.0.0.3:{p2}/health") == 200)
        time.sleep(1)  # the control plane writes its fetch log in batches every 0.5 s

        code, out = fleetllm("apply", "--yes")
        assert code == 0, out
        assert managed(litellm) == {ida1: "tiny-a", idb2: "tiny-b"}
        assert chat(litellm, "tiny-a").startswith(f"stub-vllm tiny-a port {p1}:")
        assert chat(litellm, "tiny-b").startswith(f"stub-vllm tiny-b port {p2}:")
        code, out = fleetllm("plan", "--detailed-exitcode")
        assert code == 0, out
        assert salt.derive("127.0.0.2", p1) not in out

        # Move tiny-a to 127.0.0.3 in a new commit; the box re-runs its installer and starts it there.
        write_fleet(repo, ports, {"127.0.0.3": [("tiny-b", p2), ("tiny-a", p3)]})
        head = git(repo, "rev-parse", "HEAD")
        wait_until("the control plane serving the new commit",
                   lambda: json.loads(urllib.request.urlopen(plane + "/health", timeout=5).read())
                   .get("revision") == head, 60)
        done = boxes["127.0.0.3"].provision(plane, FLEET_KEY)
        assert done.returncode == 0, done.stderr
        wait_until("tiny-a on its new box", lambda: http_status(f"http://127.0.0.3:{p3}/health") == 200)
        # The installer starts the box's servers one at a time (startup ordering): tiny-b too.
        wait_until("tiny-b after the install", lambda: http_status(f"http://127.0.0.3:{p2}/health") == 200)
        code, out = fleetllm("apply", "--yes")
        assert code == 0, out
        assert out.index(f"+ deployment {ida3}") < out.index(f"- deployment {ida1}")
        assert managed(litellm) == {ida3: "tiny-a", idb2: "tiny-b"}
        assert chat(litellm, "tiny-a").startswith(f"stub-vllm tiny-a port {p3}:")

        # Stop tiny-b: Healthy through one failed probe, Down at the second, its deployment removed.
        program = next(name for name in boxes["127.0.0.3"].supervisor.states() if "tiny-b" in name)
        boxes["127.0.0.3"].supervisor.ctl("stop", program)
        code, out = fleetllm("apply", "--yes")
        assert code == 0, out
        assert "1 failed probe(s) in a row" in out
        assert idb2 in managed(litellm)
        code, out = fleetllm("apply", "--yes")
        assert code == 0, out
        assert f"- deployment {idb2}" in out, out
        assert managed(litellm) == {ida3: "tiny-a"}

        # Start it again: back after two good probes in a row.
        boxes["127.0.0.3"].supervisor.ctl("start", program)
        wait_until("tiny-b back", lambda: http_status(f"http://127.0.0.3:{p2}/health") == 200)
        code, out = fleetllm("apply", "--yes")
        assert code == 0, out
        assert idb2 not in managed(litellm)
        code, out = fleetllm("apply", "--yes")
        assert code == 0, out
        assert managed(litellm) == {ida3: "tiny-a", idb2: "tiny-b"}
        assert chat(litellm, "tiny-b").startswith(f"stub-vllm tiny-b port {p2}:")
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


