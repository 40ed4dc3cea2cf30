"""Credential abuse against the real `fleetllm serve` (issue 16, findings 11 and 12).

- 60 wrong tokens on POST /login from one address: 10 are checked, the rest get 429 with
  Retry-After, and the log names the refusals without any token.
- A copy of a session cookie stops working once its session logs out.
- A short fleet key starts (every box template holds it) and is warned about in the log.
"""

from __future__ import annotations

import http.client
import urllib.parse
from collections.abc import Callable
from pathlib import Path

from tests.conftest import ROOT
from tests.pages.conftest import csrf_of
from tests.support.plane import ControlPlane

from .conftest import VIEWER_TOKEN, box_headers, plane_document

COOKIE = "fleetllm_session"


def call(plane: ControlPlane, method: str, path: str, cookie: str | None = None,
         form: dict[str, str] | None = None) -> tuple[int, dict[str, str], str]:
    conn = http.client.HTTPConnection("127.0.0.1", plane.port, timeout=10)
    headers = {"Cookie": f"{COOKIE}={cookie}"} if cookie else {}
    body = None
    if form is not None:
        body = urllib.parse.urlencode(form)
        headers["Content-Type"] = "application/x-www-form-urlencoded"
    try:
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        text = response.read().decode()
        set_cookie = response.getheader("Set-Cookie") or ""
        got = {k.lower(): v for k, v in response.getheaders()}
        if set_cookie.startswith(COOKIE + "="):
            got["cookie"] = set_cookie.split(";", 1)[0].split("=", 1)[1]
        return response.status, got, text
    finally:
        conn.close()


def login_form(plane: ControlPlane) -> tuple[str, str]:
    status, headers, html = call(plane, "GET", "/login")
    assert status == 200
    return headers["cookie"], csrf_of(html)


def test_login_brute_force_is_rate_limited(tmp_path: Path, start_plane: Callable[..., ControlPlane],
                                           figures: Callable[..., None]) -> None:
    plane = start_plane(plane_document(tmp_path, repo_path=ROOT / "fleet-repo-example"))
    cookie, csrf = login_form(plane)
    statuses = [call(plane, "POST", "/login", cookie, {"token": f"guess-{i:03d}-abcdefghijklmnopqrstuvwxyz",
                                                        "csrf": csrf})[0] for i in range(60)]
    assert statuses.count(403) == 10
    assert statuses.count(429) == 50
    status, headers, _ = call(plane, "POST", "/login", cookie, {"token": VIEWER_TOKEN, "csrf": csrf})
    assert status == 429
    assert int(headers["retry-after"]) >= 1
    plane.stop()
    refused = plane.log_events("page login refused")
    assert [e["reason"] for e in refused] == ["not a viewer, operator or admin token"] * 10 + ["rate limited"]
    log = plane.log.read_text()
    assert "guess-" not in log
    assert VIEWER_TOKEN not in log
    figures(case="60 wrong logins from one address", checked=10, refused_429=50, log_lines=len(refused))


def test_a_copied_cookie_dies_with_its_session(tmp_path: Path, start_plane: Callable[..., ControlPlane]) -> None:
    plane = start_plane(plane_document(tmp_path, repo_path=ROOT / "fleet-repo-example"))
    cookie, csrf = login_form(plane)
    status, headers, _ = call(plane, "POST", "/login", cookie, {"token": VIEWER_TOKEN, "csrf": csrf})
    assert status == 302
    session = headers["cookie"]
    assert call(plane, "GET", "/api/attention", session)[0] == 200
    copy = session
    status, _, html = call(plane, "GET", "/", session)
    assert status == 200
    assert call(plane, "POST", "/logout", session, {"csrf": csrf_of(html)})[0] == 302
    assert call(plane, "GET", "/api/attention", copy)[0] == 401
    assert call(plane, "GET", "/", copy)[0] == 302


def test_a_short_fleet_key_serves_and_is_warned_about(tmp_path: Path,
                                                      start_plane: Callable[..., ControlPlane]) -> None:
    plane = start_plane(plane_document(tmp_path, repo_path=ROOT / "fleet-repo-example"), env={"FK": "abcde"})
    assert plane.get("/vllm/config", box_headers(key="abcde"))[0] == 200
    plane.stop()
    warned = plane.log_events("short fleet key")
    assert warned
    assert warned[0]["length"] == 5
    assert "abcde" not in plane.log.read_text()
