"""Fixtures of the fault suite: known secret values, the real control plane as a process over a fleet
repository, and a figures log.

Set FLEETLLM_FIGURES=FILE to have every test append the figures it measured (one JSON object a line):
docs/reliability.md is written from such a run.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetllm.core.fleet.bearer import Salt
from tests.support.litellm import LitellmProxy
from tests.support.plane import ControlPlane
from tests.support.upstream import litellm_upstream

# Recognisable values, so that a grep for them over logs, files and answers proves their absence.
FLEET_KEY = "fk-faults-7Qm2ZpX9vL4sN8rT"
SALT = "salt-faults-Hb3Kd9Wq2Lx7Vn5R"
LEGACY_KEY = "sk-legacy-faults-Jt6Yp1Mc8Ze4"
ADMIN_TOKEN = "admin-faults-Rg5Tn2Qw9Pk3Xs"
VIEWER_TOKEN = "viewer-faults-Lc4Vb8Nm1Qz6"
HOOK_SECRET = "hook-faults-Dw7Fy3Gh5Js2"
PLANE_ENV = {"FK": FLEET_KEY, "SALT": SALT, "LEGACY": LEGACY_KEY, "ADMIN": ADMIN_TOKEN, "VIEWER": VIEWER_TOKEN,
             "HOOK": HOOK_SECRET}
KNOWN_BOX = "203.0.113.24"  # a box of fleet-repo-example


def plane_document(state_dir: Path, *, repo_path: Path | None = None, repo_url: str | None = None,
                   refresh_interval_s: float = 3600, **extra: Any) -> dict[str, Any]:
    repo: dict[str, Any] = {"branch": "main", "refresh_interval_s": refresh_interval_s, "webhook_secret": "${env:HOOK}"}
    if repo_url is not None:
        repo.update(url=repo_url, clone_dir=str(state_dir / "clone.git"))
    else:
        repo["path"] = str(repo_path)
    return {"repo": repo,
            "secrets": {"fleet_key": "${env:FK}", "vllm_api_salt": "${env:SALT}", "legacy_api_key": "${env:LEGACY}"},
            "state": {"url": f"sqlite:///{state_dir / 'state.sqlite3'}"},
            "admin_tokens": ["${env:ADMIN}"], "viewer_tokens": ["${env:VIEWER}"], **extra}


def box_headers(host: str | None = KNOWN_BOX, key: str | None = FLEET_KEY) -> dict[str, str]:
    headers = {}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    if host is not None:
        headers["X-LLMAO-Host"] = host
        if host:
            headers["X-Fleetllm-Report-Key"] = Salt(SALT).report_key(host)  # POST /vllm/report: its own
    return headers


def viewer() -> dict[str, str]:
    return {"Authorization": f"Bearer {VIEWER_TOKEN}"}


def push_hook(plane: ControlPlane) -> tuple[int, Any]:
    """A signed GitHub push webhook for main: the server refreshes at once."""
    from tests.support.plane import request

    body = json.dumps({"ref": "refs/heads/main"}).encode()
    signature = "sha256=" + hmac.new(HOOK_SECRET.encode(), body, hashlib.sha256).hexdigest()
    status, _, answer = request(plane.url + "/hooks/push", {"X-Hub-Signature-256": signature,
                                                            "Content-Type": "application/json"}, "POST", body)
    return status, json.loads(answer)


def metric(text: str, name: str) -> float:
    """The value of an unlabelled sample (0 when absent)."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


@pytest.fixture
def start_plane(tmp_path: Path) -> Iterator[Callable[..., ControlPlane]]:
    """start_plane(document, name=...) -> a running control plane; every one is stopped at teardown."""
    started: list[ControlPlane] = []

    def start(document: dict[str, Any], name: str = "plane", wait_status: tuple[int, ...] = (200,),
              env: dict[str, str] | None = None) -> ControlPlane:
        plane = ControlPlane(tmp_path / name, document, {**PLANE_ENV, **(env or {})})
        started.append(plane)
        return plane.start(wait_status=wait_status)

    yield start
    for plane in started:
        plane.stop()


@pytest.fixture
def figures(request: pytest.FixtureRequest) -> Callable[..., None]:
    """figures(case=..., **numbers): appended to $FLEETLLM_FIGURES as one JSON line, when set."""
    target = os.environ.get("FLEETLLM_FIGURES")

    def record(**numbers: Any) -> None:
        if target:
            with open(target, "a") as out:
                out.write(json.dumps({"test": request.node.nodeid, **numbers}) + "\n")

    return record


@pytest.fixture
def upstream() -> Iterator[LitellmProxy]:
    """The real LiteLLM when the environment names one, else the fake of its API (tests/support/upstream.py)."""
    with litellm_upstream("sk-faults-fake-master-Zr5Yq") as proxy:
        yield proxy
