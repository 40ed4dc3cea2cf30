"""Tracking the branch in real git repositories: new commits, invalid commits, force-pushes, remotes."""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Callable
from pathlib import Path

from flask.testing import FlaskClient

from fleetllm.server.app import create_app
from fleetllm.server.runtime import Runtime
from tests.conftest import git
from tests.server.conftest import KNOWN_BOX, WEBHOOK_SECRET, LogCapture, box_headers

NEW_BOX = "203.0.113.99"


def commit_placement(repo: Path, extra: str, message: str) -> str:
    with (repo / "placement.yaml").open("a") as fh:
        fh.write(extra)
    git(repo, "commit", "-qam", message)
    return git(repo, "rev-parse", "HEAD")


def add_box(repo: Path, name: str = NEW_BOX) -> str:
    return commit_placement(repo, f"\n  {name}:\n    - [qwen3-8b, 8001]\n", f"add {name}")


def break_placement(repo: Path) -> str:
    return commit_placement(repo, "\n  203.0.113.98:\n    - [no-such-model, 8001]\n", "bad model")


def served_host(client: FlaskClient, host: str) -> int:
    return int(client.get("/vllm/config", headers=box_headers(host)).status_code)


def test_new_valid_commit_served_after_refresh(runtime: Runtime, fleet_git: Path) -> None:
    client = create_app(runtime).test_client()
    first = runtime.tracker.served.revision  # type: ignore[union-attr]
    assert served_host(client, NEW_BOX) == 404
    new = add_box(fleet_git)
    assert runtime.tracker.refresh() is True
    assert runtime.tracker.served.revision == new  # type: ignore[union-attr]
    response = client.get("/vllm/config", headers=box_headers(NEW_BOX))
    assert response.status_code == 200
    assert response.headers["X-Fleet-Revision"] == new != first
    assert runtime.tracker.refresh() is False  # nothing new


def test_invalid_commit_keeps_old_revision_and_is_reported_once(runtime: Runtime, fleet_git: Path,
                                                                logs: LogCapture) -> None:
    client = create_app(runtime).test_client()
    good = runtime.tracker.served.revision  # type: ignore[union-attr]
    bad = break_placement(fleet_git)
    for _ in range(3):
        assert runtime.tracker.refresh() is False
    assert runtime.tracker.served.revision == good  # type: ignore[union-attr]
    response = client.get("/vllm/config", headers=box_headers(KNOWN_BOX))
    assert response.headers["X-Fleet-Revision"] == good
    health = client.get("/health").get_json()
    assert health["revision"] == good
    assert health["last_attempted"]["revision"] == bad
    assert health["last_attempted"]["valid"] is False
    assert any("no-such-model" in e for e in health["last_attempted"]["errors"])
    assert len(logs.events("invalid commit not served")) == 1
    metrics = client.get("/metrics").data.decode()
    assert "fleetllm_commit_validation_failures_total 1.0" in metrics
    assert "fleetllm_last_attempted_revision_valid 0.0" in metrics
    assert f'fleetllm_served_revision_info{{revision="{good}"}} 1.0' in metrics
    # The fix is a new commit on top: served at once.
    git(fleet_git, "revert", "--no-edit", "HEAD")
    assert runtime.tracker.refresh() is True
    assert runtime.tracker.attempted.valid is True  # type: ignore[union-attr]


def test_valid_commit_behind_an_invalid_head_is_served(runtime: Runtime, fleet_git: Path) -> None:
    middle = add_box(fleet_git)
    break_placement(fleet_git)
    runtime.tracker.refresh()
    assert runtime.tracker.served.revision == middle  # type: ignore[union-attr]


def test_force_push_local(runtime: Runtime, fleet_git: Path) -> None:
    base = runtime.tracker.served.revision  # type: ignore[union-attr]
    add_box(fleet_git)
    runtime.tracker.refresh()
    git(fleet_git, "reset", "-q", "--hard", base)
    replacement = add_box(fleet_git, "203.0.113.77")
    runtime.tracker.refresh()
    served = runtime.tracker.served
    assert served is not None
    assert served.revision == replacement
    assert NEW_BOX not in served.fleet.boxes
    assert "203.0.113.77" in served.fleet.boxes


def test_force_push_to_invalid_history_serves_its_newest_valid_commit(runtime: Runtime, fleet_git: Path) -> None:
    base = runtime.tracker.served.revision  # type: ignore[union-attr]
    add_box(fleet_git)
    runtime.tracker.refresh()
    git(fleet_git, "reset", "-q", "--hard", base)
    break_placement(fleet_git)
    runtime.tracker.refresh()
    assert runtime.tracker.served.revision == base  # type: ignore[union-attr]


def test_no_valid_commit_ever_health_503(tmp_path: Path, make_runtime: Callable[..., Runtime],
                                         fleet_git: Path) -> None:
    (fleet_git / "models.yaml").write_text("models: {}\n")
    git(fleet_git, "commit", "-qam", "empty catalog")
    git(fleet_git, "checkout", "-q", "--orphan", "broken")
    git(fleet_git, "commit", "-qm", "only broken")
    runtime = make_runtime(repo={"branch": "broken"})
    client = create_app(runtime).test_client()
    health = client.get("/health")
    assert health.status_code == 503
    assert health.get_json()["status"] == "unavailable"
    assert health.get_json()["last_attempted"]["valid"] is False
    assert client.get("/vllm/config", headers=box_headers()).status_code == 503


def test_health_when_serving(client: FlaskClient, runtime: Runtime) -> None:
    body = client.get("/health").get_json()
    assert body["status"] == "ok"
    assert (body["hosts"], body["servers"]) == (4, 7)
    assert body["revision"] == runtime.tracker.served.revision  # type: ignore[union-attr]
    assert body["last_refresh"]["error"] is None


def bare_remote(tmp_path: Path, fleet_git: Path) -> Path:
    remote = tmp_path / "remote.git"
    git(tmp_path, "clone", "-q", "--bare", str(fleet_git), str(remote))
    git(fleet_git, "remote", "add", "origin", str(remote))
    return remote


def test_remote_url_cloned_fetched_and_force_pushed(tmp_path: Path, fleet_git: Path,
                                                   make_runtime: Callable[..., Runtime]) -> None:
    remote = bare_remote(tmp_path, fleet_git)
    runtime = make_runtime(repo={"path": None, "url": f"file://{remote}", "clone_dir": str(tmp_path / "clone")})
    base = runtime.tracker.served.revision  # type: ignore[union-attr]
    assert (tmp_path / "clone" / "HEAD").is_file()
    added = add_box(fleet_git)
    git(fleet_git, "push", "-q", "origin", "main")
    assert runtime.tracker.refresh() is True
    assert runtime.tracker.served.revision == added  # type: ignore[union-attr]
    git(fleet_git, "reset", "-q", "--hard", base)
    rewritten = add_box(fleet_git, "203.0.113.77")
    git(fleet_git, "push", "-q", "--force", "origin", "main")
    assert runtime.tracker.refresh() is True
    served = runtime.tracker.served
    assert served is not None
    assert served.revision == rewritten
    assert NEW_BOX not in served.fleet.boxes


def test_remote_unreachable_keeps_serving(tmp_path: Path, fleet_git: Path,
                                          make_runtime: Callable[..., Runtime]) -> None:
    remote = bare_remote(tmp_path, fleet_git)
    runtime = make_runtime(repo={"path": None, "url": f"file://{remote}", "clone_dir": str(tmp_path / "clone")})
    served = runtime.tracker.served
    remote.rename(tmp_path / "gone.git")
    assert runtime.tracker.refresh() is False
    assert runtime.tracker.served is served
    assert runtime.tracker.refresh_status.error is not None
    health = create_app(runtime).test_client().get("/health").get_json()
    assert health["status"] == "ok"
    assert health["last_refresh"]["error"]


def sign(body: bytes, secret: str = WEBHOOK_SECRET) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def test_push_webhook_refreshes(client: FlaskClient, runtime: Runtime, fleet_git: Path) -> None:
    new = add_box(fleet_git)
    body = json.dumps({"ref": "refs/heads/main", "after": new}).encode()
    assert client.post("/hooks/push", data=body).status_code == 403
    assert client.post("/hooks/push", data=body, headers={"X-Hub-Signature-256": sign(body, "wrong")}).status_code \
        == 403
    other = json.dumps({"ref": "refs/heads/feature"}).encode()
    ignored = client.post("/hooks/push", data=other, headers={"X-Hub-Signature-256": sign(other)})
    assert ignored.get_json()["status"] == "ignored"
    assert runtime.tracker.served.revision != new  # type: ignore[union-attr]
    response = client.post("/hooks/push", data=body, headers={"X-Hub-Signature-256": sign(body)})
    assert response.status_code == 200
    assert response.get_json() == {"status": "refreshed", "changed": True, "revision": new}
    ping = b'{"zen": "hi"}'
    assert client.post("/hooks/push", data=ping, headers={"X-Hub-Signature-256": sign(ping),
                                                          "X-GitHub-Event": "ping"}).get_json() == {"status": "pong"}


def test_webhook_off_without_secret(make_runtime: Callable[..., Runtime]) -> None:
    runtime = make_runtime(repo={"webhook_secret": None})
    client = create_app(runtime).test_client()
    assert client.post("/hooks/push", data=b"{}", headers={"X-Hub-Signature-256": sign(b"{}")}).status_code == 404
