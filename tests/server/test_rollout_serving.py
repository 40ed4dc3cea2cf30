"""GET /vllm/config under staged rollouts, through the real Flask app over a real git repository and the
real state store: an agent box is served the revision it is released (rendered from git by SHA), every
other box the newest valid commit exactly as before; /health shows the rollout."""

from __future__ import annotations

from pathlib import Path

from flask.testing import FlaskClient

from llmfleet.adapters.state.records import BoxReport
from llmfleet.core.fleet.jsonvalue import freeze_mapping
from llmfleet.core.rollout.model import BoxRelease, BoxState, Rollout, RolloutState
from llmfleet.server.runtime import Runtime
from llmfleet_contract.report import ReportOutcome
from tests.conftest import git
from tests.server.conftest import KNOWN_BOX, box_headers


def commit(repo: Path, path: str, old: str, new: str, message: str) -> str:
    file = repo / path
    text = file.read_text()
    assert old in text
    file.write_text(text.replace(old, new, 1))
    git(repo, "commit", "-qam", message)
    return git(repo, "rev-parse", "HEAD")


def report(runtime: Runtime, revision: str, *, agent: bool) -> None:
    body = {"agent": True} if agent else {}
    runtime.store.record_report(BoxReport(KNOWN_BOX, runtime.clock(), "192.0.2.50", revision, "test",
                                          ReportOutcome.INSTALLED, freeze_mapping(body)), keep=5)


def release(runtime: Runtime, target: str, revision: str) -> None:
    runtime.store.save_rollout(Rollout(target, RolloutState.RUNNING, 1.0, 2.0, waves=1),
                               {KNOWN_BOX: BoxRelease(KNOWN_BOX, revision, revision, 2.0, BoxState.WAITING,
                                                      reason="waits for the disruption budget of qwen3-8b")})


def fetch(client: FlaskClient, **headers: str):  # type: ignore[no-untyped-def]
    return client.get("/vllm/config", headers=box_headers(**headers), environ_base={"REMOTE_ADDR": "192.0.2.50"})


def test_an_agent_box_is_served_its_released_revision(runtime: Runtime, client: FlaskClient,
                                                      fleet_git: Path) -> None:
    r1 = git(fleet_git, "rev-parse", "HEAD")
    r2 = commit(fleet_git, "models.yaml", "max-num-batched-tokens: 4096", "max-num-batched-tokens: 8192", "a boot change")
    assert runtime.tracker.refresh() and runtime.tracker.served is not None
    assert runtime.tracker.served.revision == r2
    head = fetch(client)
    assert head.get_json()["revision"] == r2 and head.get_json()["agent"] == {"poll_s": 30}

    release(runtime, r2, r1)  # released r1, but no report from the agent yet: the head, as before
    assert fetch(client).get_json()["revision"] == r2
    report(runtime, r1, agent=False)  # an installer without the agent: the head
    assert fetch(client).get_json()["revision"] == r2

    report(runtime, r1, agent=True)
    old = fetch(client)
    assert old.status_code == 200 and old.get_json()["revision"] == r1
    assert old.headers["X-Fleet-Revision"] == r1 and old.headers["ETag"] != head.headers["ETag"]
    assert "4096" in old.get_json()["servers"][0]["args"]
    again = fetch(client, **{"If-None-Match": old.headers["ETag"]})
    assert again.status_code == 304

    release(runtime, r2, r2)  # released the target: the head
    assert fetch(client).get_json()["revision"] == r2


def test_a_manual_box_gets_the_head_whatever_its_release(runtime: Runtime, client: FlaskClient,
                                                         fleet_git: Path) -> None:
    r1 = git(fleet_git, "rev-parse", "HEAD")
    r2 = commit(fleet_git, "fleet.yaml", "  mode: auto ", "  mode: manual ", "rollout: manual")
    assert runtime.tracker.refresh()
    release(runtime, r2, r1)
    report(runtime, r1, agent=True)
    body = fetch(client).get_json()
    assert body["revision"] == r2 and "agent" not in body


def test_a_release_that_cannot_be_rendered_is_refused_not_replaced(runtime: Runtime, client: FlaskClient) -> None:
    served = runtime.tracker.served
    assert served is not None
    release(runtime, served.revision, "f" * 40)
    report(runtime, "f" * 40, agent=True)
    refused = fetch(client)
    assert refused.status_code == 503
    assert "released revision ffffffffffff" in refused.get_json()["error"]


def test_health_shows_the_rollout(runtime: Runtime, client: FlaskClient) -> None:
    assert "rollout" not in client.get("/health").get_json()
    served = runtime.tracker.served
    assert served is not None
    release(runtime, served.revision, served.revision)
    report(runtime, served.revision, agent=True)
    rollout = client.get("/health").get_json()["rollout"]
    assert rollout["target"] == served.revision and rollout["state"] == "running" and rollout["waves"] == 1
    assert rollout["boxes"][KNOWN_BOX]["why"] == "waits for the disruption budget of qwen3-8b"
    assert rollout["boxes"][KNOWN_BOX]["applied"] == served.revision
