"""Provisioning scripts: linted (shellcheck, hadolint), and run for real against the loopback control plane.

The RunPod image itself cannot be built here (no Docker engine): its Dockerfile is linted, and its
entrypoint script runs on this machine with a real supervisord.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from supervisor.options import UnhosedConfigParser

from fleetllm_installer.zipapp import build_zipapp_bytes
from tests.conftest import ROOT
from tests.installer.conftest import BOX, FLEET_KEY, FakeControlPlane
from tests.installer.realprocs import http_status, pid_alive, wait_until, write_supervisord_conf

PROVISION = ROOT / "installer" / "fleetllm_installer" / "provision"
VENV_BIN = Path(sys.executable).parent


def tool(name: str) -> str:
    found = shutil.which(name, path=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    assert found, f"{name} is a dev dependency: run make venv"
    return found


@pytest.mark.parametrize("script", ["vast.sh", "runpod.sh"])
def test_shellcheck(script: str) -> None:
    done = subprocess.run([tool("shellcheck"), "--severity=style", str(PROVISION / script)],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout


def test_hadolint_dockerfile() -> None:
    done = subprocess.run([tool("hadolint"), str(PROVISION / "Dockerfile")], capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, done.stdout


def test_image_supervisord_conf_includes_the_installer_directory() -> None:
    parser = UnhosedConfigParser()
    parser.read([str(PROVISION / "supervisord.conf")])
    assert parser.get("include", "files") == "/etc/supervisor/conf.d/*.conf"
    assert parser.get("supervisord", "nodaemon") == "true"
    dockerfile = (PROVISION / "Dockerfile").read_text()
    assert "FLEETLLM_SUPERVISOR_CONF_DIR=/etc/supervisor/conf.d" in dockerfile
    assert 'ENTRYPOINT ["/usr/local/bin/fleetllm-provision"]' in dockerfile


@pytest.fixture
def serving_plane(control_plane: FakeControlPlane) -> FakeControlPlane:
    control_plane.installer = build_zipapp_bytes()
    return control_plane


def script_env(box_env: Path, plane: FakeControlPlane, **extra: str) -> dict[str, str]:
    """The provider's environment: legacy variable names, as an llmao box template has them."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEETLLM_", "LLMAO_"))}
    env.update({"ASFQUART_URL": plane.url, "FLEET_KEY": FLEET_KEY, "FLEETLLM_PYTHON": sys.executable,
                "FLEETLLM_SUPERVISOR_CONF_DIR": str(box_env.parent / "conf.d"), "FLEETLLM_LISTEN_HOST": "127.0.0.1",
                "FLEETLLM_FETCH_DEADLINE_S": "0"})
    env.update(extra)
    return env


def test_vast_script_fetches_and_runs_the_installer(box_env: Path, serving_plane: FakeControlPlane) -> None:
    env = script_env(box_env, serving_plane, PUBLIC_IPADDR=BOX, DATA_DIRECTORY=str(box_env))
    done = subprocess.run(["bash", str(PROVISION / "vast.sh"), "--handover", "none"], env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    digest = hashlib.sha256(serving_plane.installer or b"").hexdigest()
    assert f"installer sha256 {digest}" in done.stderr
    assert (box_env / "fleetllm" / "bin" / "fleetllm-box.pyz").read_bytes() == serving_plane.installer
    assert sorted(p.name for p in (box_env.parent / "conf.d").iterdir()) == [
        "fleetllm-large.conf", "fleetllm-small.conf"]
    assert serving_plane.reports[-1]["outcome"] == "installed"
    installer_request = serving_plane.requests[0]
    assert installer_request["path"] == "/vllm/installer"
    assert installer_request["headers"]["x-llmao-host"] == BOX


def test_vast_script_refuses_an_installer_that_is_not_the_pinned_one(box_env: Path,
                                                                    serving_plane: FakeControlPlane) -> None:
    env = script_env(box_env, serving_plane, PUBLIC_IPADDR=BOX, DATA_DIRECTORY=str(box_env),
                     FLEETLLM_INSTALLER_SHA256="0" * 64)
    done = subprocess.run(["bash", str(PROVISION / "vast.sh")], env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode != 0
    assert "does not match FLEETLLM_INSTALLER_SHA256" in done.stderr
    assert not (box_env.parent / "conf.d").exists()


def download_code(script: str) -> str:
    text = (PROVISION / script).read_text()
    return text.split("<<'PY'\n", 1)[1].split("\nPY\n", 1)[0]


def test_both_scripts_download_the_installer_with_the_same_code() -> None:
    assert "opener.open(request" in download_code("vast.sh")
    assert download_code("vast.sh") == download_code("runpod.sh")


def test_vast_script_names_the_missing_setting(box_env: Path, serving_plane: FakeControlPlane) -> None:
    env = {k: v for k, v in script_env(box_env, serving_plane, PUBLIC_IPADDR=BOX, DATA_DIRECTORY=str(box_env)).items()
           if k != "FLEET_KEY"}
    done = subprocess.run(["bash", str(PROVISION / "vast.sh")], env=env, capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode != 0
    assert "set FLEETLLM_URL and FLEETLLM_FLEET_KEY in the box template" in done.stderr


def test_vast_script_needs_the_public_ip(box_env: Path, serving_plane: FakeControlPlane) -> None:
    done = subprocess.run(["bash", str(PROVISION / "vast.sh")], env=script_env(box_env, serving_plane),
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert "PUBLIC_IPADDR is not set" in done.stderr


@pytest.fixture
def entrypoint(box_env: Path, serving_plane: FakeControlPlane, tmp_path: Path) -> Iterator[Any]:
    """Start a container entrypoint (runpod.sh by default); stop whatever it became at the end."""
    short = Path(tempfile.mkdtemp(prefix="llmf-rp-", dir="/tmp"))
    conf_dir = box_env.parent / "conf.d"
    conf_dir.mkdir()
    config = write_supervisord_conf(tmp_path, short, conf_dir)
    started: list[subprocess.Popen[bytes]] = []

    def start(argv: list[str] | None = None, **extra: str) -> subprocess.Popen[bytes]:
        env = script_env(box_env, serving_plane, RUNPOD_POD_ID=BOX, FLEETLLM_DATA_DIR=str(box_env),
                         FLEETLLM_SUPERVISOR_CONFIG=str(config), FLEETLLM_STARTSECS="1", **extra)
        env["PATH"] = os.environ["PATH"]  # box_env's: the stub vLLM, the fake nvidia-smi, supervisord
        process = subprocess.Popen(argv or ["bash", str(PROVISION / "runpod.sh")], env=env,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        started.append(process)
        return process

    yield start
    for process in started:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=90)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    shutil.rmtree(short, ignore_errors=True)


def cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")


def environ(pid: int) -> str:
    return Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")


def becomes_supervisord(pid: int) -> bool:
    return pid_alive(pid) and any(part.endswith("supervisord") for part in cmdline(pid)[:2])


def test_runpod_entrypoint_becomes_supervisord_and_runs_the_servers(entrypoint: Any,
                                                                    serving_plane: FakeControlPlane,
                                                                    box_json: dict[str, Any]) -> None:
    process = entrypoint()
    wait_until("the entrypoint to exec supervisord", lambda: becomes_supervisord(process.pid))
    assert "-n" in cmdline(process.pid)
    assert FLEET_KEY not in environ(process.pid)  # the fleet key does not reach supervisord or vLLM
    for server in box_json["servers"]:
        wait_until(f"{server['name']} healthy", lambda s=server: http_status(f"http://127.0.0.1:{s['port']}/health")
                   == 200)
    assert serving_plane.reports[-1]["outcome"] == "installed"


def test_runpod_entrypoint_keeps_the_container_up_when_provisioning_fails(entrypoint: Any,
                                                                         serving_plane: FakeControlPlane) -> None:
    process = entrypoint(FLEET_KEY="wrong-key")
    wait_until("the fallback supervisord", lambda: becomes_supervisord(process.pid))
    assert "wrong-key" not in environ(process.pid)
    assert process.poll() is None


def test_installer_exec_handover_becomes_supervisord(entrypoint: Any, serving_plane: FakeControlPlane,
                                                     box_json: dict[str, Any]) -> None:
    """`--handover exec`: the installer itself becomes `supervisord -n`, without the fleet key."""
    process = entrypoint([sys.executable, "-m", "fleetllm_installer", "--handover", "exec"], LLMAO_HOST=BOX,
                         FLEETLLM_URL=serving_plane.url, FLEETLLM_FLEET_KEY=FLEET_KEY, PYTHONPATH=str(ROOT))
    wait_until("the installer to exec supervisord", lambda: becomes_supervisord(process.pid))
    assert FLEET_KEY not in environ(process.pid)
    for server in box_json["servers"]:
        wait_until(f"{server['name']} healthy", lambda s=server: http_status(f"http://127.0.0.1:{s['port']}/health")
                   == 200)
