"""The access log of pages and APIs, against the real `fleetllm serve`: one `request` line per answer
(method, the route's path, query parameter names, status, bytes, ms, peer, role), none for the box
contract's /vllm/* (its own `box request` line is the one), and never a token, cookie, Authorization
header, fleet key, query value or unknown path, even when a client puts a secret in each of them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.conftest import ROOT
from tests.faults.test_auth_abuse import COOKIE, call, login_form
from tests.support.plane import ControlPlane, request

from .conftest import ADMIN_TOKEN, FLEET_KEY, HOOK_SECRET, VIEWER_TOKEN, box_headers, plane_document, viewer


def test_pages_and_apis_are_logged_without_a_secret(tmp_path: Path, start_plane: Callable[..., ControlPlane]) -> None:
    plane = start_plane(plane_document(tmp_path, repo_path=ROOT / "fleet-repo-example"))
    cookie, csrf = login_form(plane)
    status, headers, _ = call(plane, "POST", "/login", cookie, {"token": VIEWER_TOKEN, "csrf": csrf})
    assert status == 302
    session = headers["cookie"]
    assert call(plane, "GET", "/", session)[0] == 200
    assert plane.get(f"/admin/reports?token={ADMIN_TOKEN}&key={FLEET_KEY}", viewer())[0] == 200
    assert plane.get("/admin/reports", {"Authorization": f"Bearer {ADMIN_TOKEN}"})[0] == 200
    assert plane.get("/admin/reports", {"Authorization": "Bearer wrong-token-abcdefghijklmnopqrstuvwxyz"})[0] == 403
    assert plane.get("/health", {"Cookie": f"{COOKIE}={session}"})[0] == 200
    assert plane.get(f"/no/such/page?secret={HOOK_SECRET}")[0] == 404
    assert plane.get(f"/{FLEET_KEY}")[0] == 404  # a key pasted where a path goes: the path is not logged
    assert request(plane.url + "/vllm/config", box_headers())[0] == 200
    assert plane.stop() == 0

    lines = plane.log_events("request")
    seen = {(e["method"], e["path"], e["status"], e["role"]) for e in lines}
    assert {("GET", "/login", 200, "none"), ("POST", "/login", 302, "none"), ("GET", "/", 200, "viewer"),
            ("GET", "/admin/reports", 200, "viewer"), ("GET", "/admin/reports", 200, "admin"),
            ("GET", "/admin/reports", 403, "none"), ("GET", "/health", 200, "none"),
            ("GET", None, 404, "none")} <= seen
    assert not [e for e in lines if (e["path"] or "").startswith("/vllm/")]  # logged once, as a box request
    assert len(plane.log_events("box request")) == 1
    for entry in lines:
        assert entry["logger"] == "fleetllm.access" and entry["level"] == "info"
        assert entry["peer"] == "127.0.0.1" and entry["ms"] >= 0 and entry["bytes"] >= 0
    queried = [e for e in lines if e["query"]]
    assert sorted(e["query"] for e in queried) == [["secret"], ["token", "key"]]
    text = plane.log.read_text()
    for secret in (VIEWER_TOKEN, ADMIN_TOKEN, FLEET_KEY, HOOK_SECRET, session, cookie, csrf, "wrong-token-abc"):
        assert secret not in text, secret


def test_serve_takes_its_level_from_the_config_and_the_environment(tmp_path: Path,
                                                                    start_plane: Callable[..., ControlPlane]) -> None:
    """log_level: error in the config drops the info lines (start-up, access log); FLEETLLM_LOG_LEVEL
    overrides the config."""
    document = plane_document(tmp_path, repo_path=ROOT / "fleet-repo-example", log_level="error")
    quiet = start_plane(document, name="quiet")
    loud = start_plane(document, name="loud", env={"FLEETLLM_LOG_LEVEL": "info"})
    for plane in (quiet, loud):
        assert plane.get("/health")[0] == 200
        assert plane.stop() == 0
    assert quiet.log.read_text() == ""  # not a line: no info line, and nothing printed outside the log
    assert {"serving revision", "request"} <= {e["event"] for e in loud.log_events()}
