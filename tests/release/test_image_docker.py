"""The image built and run by a real Docker engine: read-only, as uid 10001, healthy through its own
HEALTHCHECK, stopped cleanly. Opt-in (FLEETLLM_TEST_DOCKER=1; tests/release/conftest.py collects it only then), as the project's machines run no Docker
engine and reach no image registry: .ci/run does not run it, and tests/release/test_image.py plays the
runtime stage without Docker there. The release workflow runs the same checks on the image it publishes.

Where no registry is reachable, give a stand-in for the base (deploy/README.md, "How these files are
checked", builds one with debootstrap): FLEETLLM_TEST_IMAGE_BASE=fleetllm-standin/python:3.11-bookworm.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import yaml

from fleetllm.demo.procs import free_port
from fleetllm_contract import version
from tests.conftest import ROOT, TEST_LEGACY_KEY, TEST_SALT

UID = 10001
FLEET_KEY = "fleet-key-for-the-docker-test-0123456789"

def docker(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, check=False)
    if check:
        assert done.returncode == 0, f"docker {' '.join(args)}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
    return done


def test_the_image_serves_read_only_as_uid_10001(tmp_path: Path, fleet_git: Path) -> None:
    assert shutil.which("docker"), "FLEETLLM_TEST_DOCKER=1 but no docker command"
    tag = f"fleetllm:test-{uuid.uuid4().hex[:8]}"
    build = ["build", "--network", "host", "-t", tag]
    if base := os.environ.get("FLEETLLM_TEST_IMAGE_BASE"):
        build += ["--build-arg", f"PYTHON_IMAGE={base}"]
    docker(*build, str(ROOT), timeout=1200)
    name = f"fleetllm-test-{uuid.uuid4().hex[:8]}"
    try:
        assert docker("run", "--rm", "--read-only", "--tmpfs", "/tmp", tag, "--version").stdout.strip() \
            == f"fleetllm {version.__version__}"
        assert docker("run", "--rm", "--entrypoint", "id", tag, "-u").stdout.strip() == str(UID)
        # A plain build has no gateway builds (the release adds them): their directory is there, empty.
        assert docker("run", "--rm", "--entrypoint", "find", tag, "/opt/fleetllm/share/fleetllm/gateway-native",
                      "-mindepth", "1").stdout == ""
        credentials = tmp_path / "credentials"
        credentials.mkdir()
        for file_name, value in (("fleet-key", FLEET_KEY), ("vllm-api-salt", TEST_SALT),
                                 ("legacy-api-key", TEST_LEGACY_KEY)):
            (credentials / file_name).write_text(value + "\n")
        etc = tmp_path / "etc"
        etc.mkdir()
        (etc / "control-plane.yaml").write_text(yaml.safe_dump({
            "repo": {"url": "file:///srv/fleet", "branch": "main", "refresh_interval_s": 3600,
                     "clone_dir": "/var/lib/fleetllm/fleet-repo.git"},
            "secrets": {"fleet_key": "${cred:fleet-key}", "vllm_api_salt": "${cred:vllm-api-salt}",
                        "legacy_api_key": "${cred:legacy-api-key}"},
            "state": {"url": "sqlite:////var/lib/fleetllm/state.sqlite3"}}))
        for path in (credentials, fleet_git):  # the container's user reads them, as a Secret's files
            subprocess.run(["chown", "-R", f"{UID}:{UID}", str(path)], check=True)
        port = free_port()
        docker("run", "-d", "--name", name, "--network", "host", "--read-only", "--tmpfs", "/tmp",
               "-v", f"{etc}:/etc/fleetllm:ro", "-v", f"{credentials}:/run/credentials/fleetllm:ro",
               "-v", f"{fleet_git}:/srv/fleet:ro", "-e", f"FLEETLLM_HEALTH_URL=http://127.0.0.1:{port}/health",
               "--health-interval", "2s", tag, "serve", "--config", "/etc/fleetllm/control-plane.yaml",
               "--listen", f"127.0.0.1:{port}")
        deadline = time.monotonic() + 180
        while (state := json.loads(docker("inspect", "--format", "{{json .State}}", name).stdout))["Health"][
                "Status"] != "healthy":
            assert state["Running"] and time.monotonic() < deadline, docker("logs", name, check=False).stderr
            time.sleep(1)
        config = json.loads(docker("inspect", "--format", "{{json .HostConfig.ReadonlyRootfs}}", name).stdout)
        assert config is True
        assert docker("exec", name, "id", "-u").stdout.strip() == str(UID)
        docker("stop", "-t", "30", name)
        assert docker("inspect", "--format", "{{.State.ExitCode}}", name).stdout.strip() == "0"
        logs = docker("logs", name).stdout + docker("logs", name).stderr
        assert '"event":"serving"' in logs
        for secret in (FLEET_KEY, TEST_SALT, TEST_LEGACY_KEY):
            assert secret not in logs
    finally:
        docker("rm", "-f", "-v", name, check=False)  # and its anonymous /var/lib/fleetllm volume
        docker("rmi", "-f", tag, check=False)
