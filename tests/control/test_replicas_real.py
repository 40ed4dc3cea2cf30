"""Two control-plane replicas (`fleetllm serve` processes) sharing one state store: a pin, a suspension and a
sync request made through one are in force on the other within seconds (each replica re-reads the controls
every CONTROL_POLL_S), without a commit and without a restart."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from tests.conftest import git
from tests.server.test_revisions import add_box
from tests.support.plane import ControlPlane, request

FLEET_KEY = "fk-replicas-Zq4Wm7Rt2Yp9Lx"
SALT = "salt-replicas-Hj3Kv8Nc5Bd1"
ADMIN = "admin-replicas-Pf6Sg2Xe9Qa4Tw"
LEGACY = "sk-legacy-replicas-Gt5Mw"
BOX = "203.0.113.24"  # a box of fleet-repo-example

pytestmark = pytest.mark.slow


def served_revision(plane: ControlPlane) -> str:
    status, headers, _ = request(plane.url + "/vllm/config", {"Authorization": f"Bearer {FLEET_KEY}",
                                                              "X-LLMAO-Host": BOX})
    assert status == 200
    return headers["X-Fleet-Revision"]


def control(plane: ControlPlane) -> dict[str, object]:
    status, body = plane.json("/health")
    assert status == 200
    result: dict[str, object] = body["control"]
    return result


def test_controls_set_through_one_replica_hold_on_the_other(tmp_path: Path, fleet_git: Path) -> None:
    first = git(fleet_git, "rev-parse", "HEAD")
    newest = add_box(fleet_git)
    env = {"FK": FLEET_KEY, "SALT": SALT, "ADMIN": ADMIN, "LEGACY": LEGACY,
           "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    document = {"repo": {"path": str(fleet_git), "branch": "main", "refresh_interval_s": 3600},
                "secrets": {"fleet_key": "${env:FK}", "vllm_api_salt": "${env:SALT}", "legacy_api_key": "${env:LEGACY}"},
                "state": {"url": f"sqlite:///{tmp_path / 'shared.sqlite3'}"}, "admin_tokens": ["${env:ADMIN}"]}
    one = ControlPlane(tmp_path / "one", dict(document), env).start()
    two = ControlPlane(tmp_path / "two", dict(document), env).start()
    try:
        assert served_revision(one) == served_revision(two) == newest
        admin = {"Authorization": f"Bearer {ADMIN}", "Content-Type": "application/json"}
        status, _, body = request(one.url + "/admin/pin", admin, "POST",
                                  json.dumps({"revision": first, "reason": "replicas"}).encode())
        assert status == 200, body
        assert served_revision(one) == first  # at once on the replica that was asked
        request(one.url + "/admin/suspend", admin, "POST", b"{}")
        deadline = time.monotonic() + 20
        while served_revision(two) != first or control(two)["suspended"] is not True:
            assert time.monotonic() < deadline, "the other replica did not pick up the pin and the suspension"
            time.sleep(0.2)
        assert control(two)["pinned_revision"] == first
        request(two.url + "/admin/unpin", admin, "POST", b"{}")
        deadline = time.monotonic() + 20
        while served_revision(one) != newest:
            assert time.monotonic() < deadline, "the unpin through the other replica did not reach this one"
            time.sleep(0.2)
    finally:
        one.stop()
        two.stop()
