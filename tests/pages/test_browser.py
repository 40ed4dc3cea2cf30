"""The pages in a real browser: Debian's Chromium, headless, driven by Playwright, against the real
`fleetllm serve` process on a free loopback port. The state is the scenario's (tests/pages/scenario.py):
box fetches, reports and an unknown box through the server's own endpoints over HTTP, passes by the
real Reconciler into the same state file. An operator logs in, sees a Healthy and a Stalled server,
approves the unknown box and sees the commit, then sees an invalid commit appear in the strip without a
reload. Screenshots at 1280 and 390 px are checked for width overflow; with FLEETLLM_SAVE_SCREENSHOTS=1
(`make screenshots`) they are written to docs/screenshots/.

The browser is never downloaded: Playwright drives /usr/bin/chromium (`apt-get install chromium`,
which .ci/run does); without it these tests skip, saying so.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fleetllm.adapters.git import GitFleetRepo
from fleetllm.adapters.state import open_store
from fleetllm.core.fleet.approve import ref_name
from fleetllm.core.fleet.validate import validate_snapshot
from fleetllm.demo.procs import stop
from tests.conftest import ROOT, git
from tests.pages.chromium import NEEDS_CHROMIUM, wait_for
from tests.pages.conftest import PAGE_ENV, page_config
from tests.pages.scenario import (
    FOREIGN_BOX,
    HEALTHY_BOX,
    STALLED_BOX,
    UNKNOWN_BOX,
    Stubs,
    break_branch,
    make_repo,
    report_body,
    run_passes,
    seeded_litellm,
)
from tests.reconcile.fakes import free_port
from tests.server.conftest import ADMIN_TOKEN, VIEWER_TOKEN, WEBHOOK_SECRET, box_headers, write_config

SCREENSHOTS = ROOT / "docs" / "screenshots"

pytestmark = NEEDS_CHROMIUM


def http(method: str, url: str, body: bytes | None = None, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def box(host: str) -> dict[str, str]:
    return box_headers(host)  # the fleet key, the claimed name and that box's report key


@dataclass
class Plane:
    url: str
    repo: Path
    state: Path
    ports: tuple[int, int]
    log: Path

    def push_hook(self) -> None:
        """What GitHub sends on a push: the server refreshes the branch now."""
        body = json.dumps({"ref": "refs/heads/main"}).encode()
        signature = "sha256=" + hmac.new(WEBHOOK_SECRET.encode(), body, hashlib.sha256).hexdigest()
        status, answer = http("POST", f"{self.url}/hooks/push", body, {"X-Hub-Signature-256": signature,
                                                                       "Content-Type": "application/json"})
        assert status == 200, answer


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    root = tmp_path_factory.mktemp("plane")
    repo = root / "fleet"
    ports = make_repo(repo)
    state = root / "state" / "cp.sqlite3"
    config = write_config(root / "control-plane.yaml", page_config(repo, state))
    port = free_port()
    log_path = root / "serve.log"
    log = log_path.open("w")
    process = subprocess.Popen([sys.executable, "-m", "fleetllm", "serve", "--config", str(config), "--listen",
                                f"127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT,
                               env={**os.environ, **PAGE_ENV}, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for("fleetllm serve", lambda: process.poll() is not None or http("GET", f"{url}/health")[0] == 200
                 if _listening(port) else process.poll() is not None)
        assert process.poll() is None, log_path.read_text()
        for host, fits in ((HEALTHY_BOX, True), (STALLED_BOX, False), (FOREIGN_BOX, None)):
            status, body = http("GET", f"{url}/vllm/config", headers=box(host))
            assert status == 200, body
            if fits is not None:
                report = json.dumps(report_body(json.loads(body), fits=fits)).encode()
                assert http("POST", f"{url}/vllm/report", report, {**box(host), "Content-Type": "application/json"})[
                    0] == 200
        assert http("GET", f"{url}/vllm/config", headers=box(UNKNOWN_BOX))[0] == 404
        reader = open_store(f"sqlite:///{state}")  # the server writes its fetch log in batches: wait for it
        try:
            wait_for("the fetch log", lambda: len(reader.last_config_served()) == 3)
        finally:
            reader.close()
        fleet_repo = GitFleetRepo(repo)
        fleet = validate_snapshot(fleet_repo.snapshot(fleet_repo.resolve("main"))).fleet
        fleet_repo.repo.close()
        assert fleet is not None
        run_passes(state, fleet, seeded_litellm(ports[0]), Stubs(ports), time.time, 2)
        yield Plane(url, repo, state, ports, log_path)
    finally:
        stop(process, timeout_s=15)
        log.close()


def _listening(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture
def context_factory(browser: Any, plane: Plane) -> Iterator[Any]:
    """New browser contexts that may reach the control plane only (nothing from the internet)."""
    contexts: list[Any] = []
    outside: list[str] = []

    def make(**options: Any) -> Any:
        context = browser.new_context(**options)

        def route(r: Any) -> None:
            if r.request.url.startswith(plane.url):
                r.continue_()
            else:
                outside.append(r.request.url)
                r.abort()

        context.route("**/*", route)
        contexts.append(context)
        return context

    yield make
    for context in contexts:
        context.close()
    assert outside == [], f"the pages asked for outside resources: {outside}"


def log_in(page: Any, plane: Plane, token: str) -> None:
    page.goto(f"{plane.url}/")
    assert page.url.startswith(f"{plane.url}/login?next=")
    page.fill("#token", token)
    page.click("button[type=submit]")
    page.wait_for_url(f"{plane.url}/")


def save(page: Any, name: str, directory: Path) -> Path:
    path = directory / name
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 10_000
    if os.environ.get("FLEETLLM_SAVE_SCREENSHOTS") == "1":
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, SCREENSHOTS / name)
    return path


def no_overflow(page: Any) -> None:
    width = page.evaluate("document.documentElement.clientWidth")
    scroll = page.evaluate("document.documentElement.scrollWidth")
    assert scroll <= width, f"the page is {scroll} px wide in a {width} px viewport"


def test_operator_journey(plane: Plane, context_factory: Any, tmp_path: Path) -> None:
    port = plane.ports[0]
    page = context_factory(viewport={"width": 1280, "height": 900}).new_page()
    log_in(page, plane, ADMIN_TOKEN)
    cookie = next(c for c in page.context.cookies() if c["name"] == "fleetllm_session")
    assert (cookie["secure"], cookie["httpOnly"], cookie["sameSite"]) == (True, True, "Strict")

    healthy = page.locator(f'tr[data-server="{HEALTHY_BOX}:{port}"]')
    assert healthy.locator(".badge").inner_text().strip() == "Healthy"
    stalled = page.locator(f'tr[data-server="{STALLED_BOX}:{port}"]')
    assert stalled.locator(".badge").inner_text().strip() == "Stalled"
    assert "never healthy" in stalled.inner_text()
    assert page.locator(".attention h2").inner_text().startswith("Needs attention")

    # approve the unknown box with one model
    item = page.locator('li[data-kind="unknown-box"]')
    item.locator("summary").click()
    item.locator("select[name=model]").first.select_option("tiny-a")
    item.locator("button[type=submit]").click()
    page.wait_for_load_state()
    commit = git(plane.repo, "rev-parse", ref_name(UNKNOWN_BOX))
    assert f"commit {commit} on branch {ref_name(UNKNOWN_BOX)}" in page.locator(".flash").inner_text()
    assert page.locator('li[data-kind="unknown-box"] code.commit').inner_text() == commit

    # an invalid commit lands on main: the strip shows it on the next refresh, without reloading the page
    page.evaluate("window.__same_document = true")
    bad = break_branch(plane.repo)
    plane.push_hook()
    page.evaluate("document.dispatchEvent(new Event('visibilitychange'))")  # what the timer does every 15 s
    invalid = page.locator('li[data-kind="invalid-commit"]')
    invalid.wait_for(timeout=10_000)
    assert bad[:12] in invalid.inner_text()
    assert "unknown model 'no-such-model'" in invalid.inner_text()
    assert page.evaluate("window.__same_document") is True
    assert page.locator("#refresh-status").inner_text().startswith("Updated")

    no_overflow(page)
    save(page, "fleet-1280.png", tmp_path)
    narrow = context_factory(viewport={"width": 390, "height": 844}).new_page()
    log_in(narrow, plane, VIEWER_TOKEN)
    no_overflow(narrow)
    assert narrow.locator(f'tr[data-server="{HEALTHY_BOX}:{port}"] .badge').is_visible()
    save(narrow, "fleet-390.png", tmp_path)
    for path in ("/models", "/revision", "/history"):
        narrow.goto(f"{plane.url}{path}")
        no_overflow(narrow)

    # the filter: the boxes needing attention whose server or model matches, kept by the auto-refresh
    narrow.goto(f"{plane.url}/")
    narrow.locator("form.filter select[name=show]").select_option("problems")
    narrow.locator("form.filter input[name=q]").fill("slow")
    narrow.locator("form.filter button[type=submit]").click()
    narrow.wait_for_url("**/?show=problems&q=slow")
    assert narrow.locator("section.box h2").all_inner_texts() == [STALLED_BOX]
    no_overflow(narrow)
    narrow.evaluate("document.dispatchEvent(new Event('visibilitychange'))")
    narrow.locator("#refresh-status", has_text="Updated").wait_for(timeout=10_000)
    assert narrow.locator("section.box h2").all_inner_texts() == [STALLED_BOX]
    assert "Showing 1 of 4 boxes" in narrow.locator("form.filter").inner_text()


def test_pages_work_without_javascript(plane: Plane, context_factory: Any) -> None:
    page = context_factory(java_script_enabled=False, viewport={"width": 1024, "height": 800}).new_page()
    log_in(page, plane, VIEWER_TOKEN)
    assert page.locator(f'tr[data-server="{HEALTHY_BOX}:{plane.ports[0]}"] .badge').inner_text().strip() == "Healthy"
    assert page.locator("noscript").count() >= 1
    page.click("nav >> text=Models")
    assert page.locator('tr[data-model="tiny-a"]').inner_text().count("degraded") == 1
    page.click("nav >> text=History")
    assert page.locator("section.pass").count() == 2
