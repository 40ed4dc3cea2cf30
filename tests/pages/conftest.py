"""Fixtures for the status pages: the scenario's world (tests/pages/scenario.py) behind the real Flask
app, and a logged-in test client."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from fleetllm.job.engine import PassOutcome
from fleetllm.server.app import create_app
from fleetllm.server.runtime import Runtime, start_up
from fleetllm.settings import load_config
from tests.conftest import git
from tests.pages.chromium import CHROMIUM, CHROMIUM_ARGS
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
from tests.reconcile.fake_litellm import FakeLitellm
from tests.server import conftest as server_conftest
from tests.server.conftest import ENV, SECRETS, Clock, LogCapture, base_config, box_headers, write_config

logs = server_conftest.logs  # the fixture, for this package too
MASTER_KEY = "sk-litellm-master-for-page-tests"
PAGE_ENV = {**ENV, "MASTER": MASTER_KEY}
PAGE_SECRETS = (*SECRETS, MASTER_KEY)


def page_config(repo: Path, state: Path, **extra: Any) -> dict[str, Any]:
    document = base_config(repo, state)
    document["litellm"] = {"url": "http://127.0.0.1:9", "master_key": "${env:MASTER}"}
    document["metrics_token"] = "${env:METRICS}"  # /metrics for that bearer only (test_openapi's metricsToken)
    document.update(extra)
    return document


@dataclass
class World:
    runtime: Runtime
    app: Flask
    repo: Path
    state: Path
    ports: tuple[int, int]
    clock: Clock
    litellm: FakeLitellm
    outcomes: list[PassOutcome]
    bad_commit: str


def fetch_and_report(client: FlaskClient, box: str, *, fits: bool = True, report: bool = True) -> None:
    response = client.get("/vllm/config", headers=box_headers(box))
    assert response.status_code == 200, response.get_data(as_text=True)
    if report:
        posted = client.post("/vllm/report", json=report_body(response.get_json(), fits=fits),  # with the
                             headers={**box_headers(box),  # report key the box JSON delivered, as a box does
                                      "X-Fleetllm-Report-Key": response.get_json()["report_key"]})
        assert posted.status_code == 200, posted.get_data(as_text=True)


def build_world(tmp_path: Path, *, passes: int = 2, broken: bool = True, bare: bool = False,
                config: dict[str, Any] | None = None, env: dict[str, str] | None = None) -> World:
    """`config`: top-level keys of the control-plane config to set (mappings are merged), or to drop (None). `broken`: end with an
    invalid commit on main. `bare`: the control plane tracks a bare clone (approvals onto the tracked branch
    need one); `World.repo` is then that clone."""
    work = tmp_path / "fleet"
    ports = make_repo(work)
    repo = work
    if bare:
        repo = tmp_path / "fleet.git"
        git(tmp_path, "clone", "-q", "--bare", str(work), str(repo))
    state = tmp_path / "state" / "cp.sqlite3"
    clock = Clock()
    document = page_config(repo, state)
    for key, value in (config or {}).items():
        if value is None:
            document.pop(key, None)
        else:
            document[key] = {**document[key], **value} if isinstance(value, dict) and key in document else value
    path = write_config(tmp_path / "control-plane.yaml", document)
    runtime = start_up(load_config(path, env={**PAGE_ENV, **(env or {})}), clock=clock)
    app = create_app(runtime)
    client = app.test_client()
    fetch_and_report(client, HEALTHY_BOX)
    fetch_and_report(client, STALLED_BOX, fits=False)
    fetch_and_report(client, FOREIGN_BOX, report=False)
    assert client.get("/vllm/config", headers=box_headers(UNKNOWN_BOX)).status_code == 404
    runtime.store.last_config_served()  # writes out the buffered fetch records
    litellm = seeded_litellm(ports[0])
    served = runtime.tracker.served
    assert served is not None
    dry_run = bool(document.get("reconcile", {}).get("dry_run"))
    outcomes = run_passes(state, served.fleet, litellm, Stubs(ports), clock, passes, apply=not dry_run) if passes else []
    bad = ""
    if broken:
        bad = break_branch(work)
        if bare:
            git(work, "push", "-q", str(repo), "main")
        runtime.tracker.refresh()
    return World(runtime, app, repo, state, ports, clock, litellm, outcomes, bad)


@pytest.fixture
def world(tmp_path: Path, logs: LogCapture) -> Iterator[World]:
    built = build_world(tmp_path)
    yield built
    built.runtime.stop()


CSRF = re.compile(r'name="csrf" value="([^"]+)"')


def csrf_of(html: str) -> str:
    found = CSRF.search(html)
    assert found is not None, html
    return found.group(1)


def login(client: FlaskClient, token: str) -> Any:
    page = client.get("/login")
    return client.post("/login", data={"token": token, "csrf": csrf_of(page.get_data(as_text=True)), "next": "/"})


@pytest.fixture
def viewer(world: World) -> FlaskClient:
    from tests.server.conftest import VIEWER_TOKEN

    client = world.app.test_client()
    assert login(client, VIEWER_TOKEN).status_code == 302
    return client


@pytest.fixture
def admin(world: World) -> FlaskClient:
    from tests.server.conftest import ADMIN_TOKEN

    client = world.app.test_client()
    assert login(client, ADMIN_TOKEN).status_code == 302
    return client


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One Chromium for a browser test module. Not session-scoped: Playwright's sync API keeps an event
    loop running in this thread while open, which other tests' asyncio.run() refuse."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        try:
            yield launched
        finally:
            launched.close()
