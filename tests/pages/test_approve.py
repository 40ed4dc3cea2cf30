"""Approve from the attention strip: the same git change as `fleetllm approve`, admin only, CSRF-checked,
and the commit it made shown where the unknown box was."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from flask.testing import FlaskClient

from fleetllm.core.fleet.approve import ref_name
from fleetllm.server.auth import token_fingerprint
from tests.conftest import git
from tests.pages.conftest import LogCapture, World, build_world, csrf_of, login
from tests.pages.scenario import UNKNOWN_BOX
from tests.server.conftest import ADMIN_TOKEN, VIEWER_TOKEN


@pytest.fixture
def sound_world(tmp_path: Path, logs: LogCapture) -> World:
    """The scenario without the invalid head (an approval builds on the head of the tracked branch)."""
    built = build_world(tmp_path, broken=False)
    yield built  # type: ignore[misc]
    built.runtime.stop()


def admin_client(world: World) -> FlaskClient:
    client = world.app.test_client()
    assert login(client, ADMIN_TOKEN).status_code == 302
    return client


def approve(client: FlaskClient, host: str, *models: str, csrf: str | None = None, provider: str = "",
            **headers: str) -> str:
    token = csrf if csrf is not None else csrf_of(client.get("/").get_data(as_text=True))
    response = client.post("/approve", data={"csrf": token, "host": host, "model": [*models, ""], "next": "/models",
                                             "provider": provider}, headers=headers)
    assert response.status_code == 302
    assert response.headers["Location"] == "/models"
    return client.get("/models").get_data(as_text=True)


def test_admin_approves_an_unknown_box(sound_world: World) -> None:
    world = sound_world
    client = admin_client(world)
    head = git(world.repo, "rev-parse", "main")
    page = approve(client, UNKNOWN_BOX, "tiny-a", "tiny-b")
    branch = ref_name(UNKNOWN_BOX)
    commit = git(world.repo, "rev-parse", branch)
    assert f"Approved {UNKNOWN_BOX} (tiny-a, tiny-b): commit {commit} on branch {branch}." in page
    assert git(world.repo, "rev-parse", "main") == head  # a branch for review; main untouched
    assert git(world.repo, "rev-parse", f"{branch}^") == head
    assert git(world.repo, "diff", "--name-only", head, branch) == "placement.yaml"
    placement = git(world.repo, "show", f"{branch}:placement.yaml")
    assert placement.startswith("# Where each model runs.\n")  # the file as written, the box added
    port, port2 = world.ports
    assert yaml.safe_load(placement)["hosts"][UNKNOWN_BOX] == [["tiny-a", port], ["tiny-b", port2]]
    [record] = world.runtime.store.approvals()
    assert (record.host, record.models, record.commit) == (UNKNOWN_BOX, ("tiny-a", "tiny-b"), commit)
    assert record.actor == f"admin:{token_fingerprint(ADMIN_TOKEN)}"  # as POST /admin/approve records it
    # the strip keeps showing the commit (after the one-time message is gone) until the branch is merged
    strip = client.get("/").get_data(as_text=True)
    assert f'<code class="commit">{commit}</code>' in strip
    assert "merge it into <code>main</code> to serve the box" in strip
    box = client.get("/api/attention").get_json()["unknown_boxes"][0]
    assert box["approval"]["commit"] == commit and box["approval"]["branch"] == branch


def test_approval_onto_the_tracked_branch_serves_the_box(tmp_path: Path, logs: LogCapture) -> None:
    world = build_world(tmp_path, broken=False, bare=True, config={"repo": {"approve": {"target": "tracked"}}})
    try:
        client = admin_client(world)
        approve(client, UNKNOWN_BOX, "tiny-a")
        fleet = client.get("/api/fleet").get_json()
        assert UNKNOWN_BOX in [b["name"] for b in fleet["boxes"]]
        assert fleet["revision"] == git(world.repo, "rev-parse", "main")
        assert client.get("/api/attention").get_json()["unknown_boxes"] == []
    finally:
        world.runtime.stop()


def test_the_form_names_the_provider(sound_world: World) -> None:
    client = admin_client(sound_world)
    assert '<select name="provider">' in client.get("/").get_data(as_text=True)
    page = approve(client, UNKNOWN_BOX, "tiny-a", provider="aws")
    assert "Unknown provider aws: choose vast, runpod or static. Nothing was approved." in page
    approve(client, UNKNOWN_BOX, "tiny-a", provider="vast")
    placement = yaml.safe_load(git(sound_world.repo, "show", f"{ref_name(UNKNOWN_BOX)}:placement.yaml"))
    assert placement["hosts"][UNKNOWN_BOX] == {"provider": "vast", "servers": [["tiny-a", sound_world.ports[0]]]}


def test_a_viewer_cannot_approve(sound_world: World) -> None:
    client = sound_world.app.test_client()
    login(client, VIEWER_TOKEN)
    page = approve(client, UNKNOWN_BOX, "tiny-a")
    assert "Approving a box needs an admin token" in page
    assert git(sound_world.repo, "branch", "--list", ref_name(UNKNOWN_BOX)) == ""


@pytest.mark.parametrize("forgery", ["no-token", "wrong-token", "cross-site", "other-origin"])
def test_forged_approvals_are_refused(sound_world: World, forgery: str) -> None:
    client = admin_client(sound_world)
    csrf = csrf_of(client.get("/").get_data(as_text=True))
    headers = {"cross-site": {"Sec-Fetch-Site": "cross-site"},
               "other-origin": {"Origin": "https://evil.example"}}.get(forgery, {})
    token = {"no-token": "", "wrong-token": csrf[::-1]}.get(forgery, csrf)
    page = approve(client, UNKNOWN_BOX, "tiny-a", csrf=token, **headers)
    assert "nothing was approved" in page
    assert git(sound_world.repo, "branch", "--list", ref_name(UNKNOWN_BOX)) == ""
    assert sound_world.runtime.store.approvals() == []


def test_refused_approvals_say_why(world: World) -> None:
    client = admin_client(world)
    page = approve(client, UNKNOWN_BOX, "tiny-a")  # main's head is invalid: nothing to build on
    assert f"{UNKNOWN_BOX} was not approved: the fleet at {world.bad_commit[:12]} is not valid; fix it first" in page
    assert "Choose at least one model" in approve(client, UNKNOWN_BOX)
    assert world.runtime.store.approvals() == []
