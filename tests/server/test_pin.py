"""A pin in the revision tracker: the pinned revision is what every box is served, new commits are
validated and wait behind it, a pin set straight in the store (another replica) is picked up by
refresh_control, and an unpin serves the newest valid commit again."""

from __future__ import annotations

from pathlib import Path

from flask.testing import FlaskClient

from fleetllm.server.app import create_app
from fleetllm.server.runtime import Runtime
from tests.conftest import git
from tests.server.conftest import KNOWN_BOX, LogCapture, box_headers
from tests.server.test_revisions import NEW_BOX, add_box


def revision_served(client: FlaskClient) -> str:
    response = client.get("/vllm/config", headers=box_headers(KNOWN_BOX))
    assert response.status_code == 200
    return str(response.headers["X-Fleet-Revision"])


def test_a_pin_holds_across_new_commits_until_unpinned(runtime: Runtime, fleet_git: Path, logs: LogCapture) -> None:
    client = create_app(runtime).test_client()
    first = git(fleet_git, "rev-parse", "HEAD")
    second = add_box(fleet_git)
    runtime.tracker.refresh()
    assert revision_served(client) == second
    runtime.store.pin(first, "admin:test", runtime.clock(), "hold")  # as another replica would
    assert runtime.tracker.pin is None  # not seen until the controls are re-read ...
    runtime.refresh_control()  # ... which the control thread does every CONTROL_POLL_S
    assert revision_served(client) == first
    assert client.get("/vllm/config", headers=box_headers(NEW_BOX)).status_code == 404  # not in the pinned revision
    third = add_box(fleet_git, "203.0.113.77")
    runtime.tracker.refresh()
    assert revision_served(client) == first  # the new commit waits behind the pin
    newest = runtime.tracker.newest_valid
    assert newest is not None and newest.revision == third
    assert logs.events("newest valid revision (pinned: not served)")
    assert 'fleetllm_served_revision_info{revision="' + first + '"} 1.0' in runtime.metrics.exposition().decode()
    runtime.store.unpin("admin:test", runtime.clock())
    runtime.refresh_control()
    assert revision_served(client) == third
    assert 'fleetllm_served_revision_info{revision="' + third + '"} 1.0' in runtime.metrics.exposition().decode()
