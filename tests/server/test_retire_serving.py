"""A box that left the placement (issue 25), through the real Flask app over a real git repository and the real
state store: while it drains it is served what it runs, while it retires a box JSON with no servers (and its
report is taken), once retired a 404; it is never an unknown box. `rollout forget` through the admin API."""

from __future__ import annotations

from pathlib import Path

import pytest
from flask.testing import FlaskClient

from fleetllm.adapters.state.passes import PassMode, PassRecord
from fleetllm.core.boxreport import BoxReport
from fleetllm.core.fleet.bearer import Salt
from fleetllm.core.fleet.jsonvalue import freeze_mapping
from fleetllm.core.rollout.model import BoxRelease, BoxState, Rollout, RolloutState
from fleetllm.core.rollout.retire import Retirement, RetireState
from fleetllm.server.runtime import Runtime
from fleetllm_contract.report import ReportOutcome
from tests.conftest import git
from tests.pages.conftest import login
from tests.server.conftest import KNOWN_BOX, OPERATOR_NAME, OPERATOR_TOKEN, TEST_SALT, VIEWER_TOKEN, box_headers

PEER = "192.0.2.50"
BLOCK = """  # Vast, 1x RTX A6000 48GB: two processes of one recipe, told apart by the third element.
  203.0.113.24:
    provider: vast
    gpu_memory_gb: 48
    disk_gb: 120
    servers:
      - [qwen3-8b, 8001]
      - [qwen3-8b, 8002, qwen3-8b-b]
"""


@pytest.fixture(autouse=True)
def fresh_releases(monkeypatch: pytest.MonkeyPatch) -> None:
    import fleetllm.server.rollouts as rollouts

    monkeypatch.setattr(rollouts, "CACHE_TTL_S", 0.0)


def fetch(client: FlaskClient, **headers: str):  # type: ignore[no-untyped-def]
    return client.get("/vllm/config", headers=box_headers(**headers), environ_base={"REMOTE_ADDR": PEER})


def remove_box(repo: Path) -> str:
    placement = repo / "placement.yaml"
    text = placement.read_text()
    assert BLOCK in text
    placement.write_text(text.replace(BLOCK, ""))
    git(repo, "commit", "-qam", f"remove {KNOWN_BOX}")
    return git(repo, "rev-parse", "HEAD")


def save(runtime: Runtime, target: str, releases: dict[str, BoxRelease], retirement: Retirement | None) -> None:
    runtime.store.save_rollout(Rollout(target, RolloutState.RUNNING, 1.0, 2.0), releases,
                               retirements={KNOWN_BOX: retirement} if retirement else None)


def test_a_leaving_box_is_drained_then_served_no_servers_then_answered_404(runtime: Runtime, client: FlaskClient,
                                                                           fleet_git: Path) -> None:
    r1 = git(fleet_git, "rev-parse", "HEAD")
    runs = fetch(client).get_json()
    assert runs["revision"] == r1 and runs["servers"]
    runtime.store.record_report(BoxReport(KNOWN_BOX, runtime.clock(), PEER, r1, "test", ReportOutcome.INSTALLED,
                                          freeze_mapping({"agent": True})), keep=5)
    save(runtime, r1, {KNOWN_BOX: BoxRelease(KNOWN_BOX, r1, r1, 1.0, BoxState.APPLIED)}, None)
    r2 = remove_box(fleet_git)
    assert runtime.tracker.refresh()

    draining = fetch(client)  # no pass has seen it gone yet: it keeps what it runs, it is not unknown
    assert draining.status_code == 200 and draining.get_json() == runs
    assert runtime.store.attention() == []

    now = runtime.clock()
    retiring = Retirement(KNOWN_BOX, r2, now, RetireState.RETIRING, r1, retiring_at=now)
    save(runtime, r2, {KNOWN_BOX: BoxRelease(KNOWN_BOX, r2, r2, 2.0, BoxState.APPLIED)}, retiring)
    empty = fetch(client)
    served = empty.get_json()
    assert empty.status_code == 200 and served == {"host": KNOWN_BOX, "revision": r2, "servers": [],
                                                    "report_key": Salt(TEST_SALT).report_key(KNOWN_BOX)}
    assert empty.headers["X-Fleet-Revision"] == r2 and empty.headers["Cache-Control"] == "no-store"
    assert fetch(client, **{"If-None-Match": empty.headers["ETag"]}).status_code == 304
    report = {"revision": r2, "installer_version": "0.1.0", "outcome": "installed", "servers": []}
    # with the report key its retiring box JSON delivered (a report without it is refused: docs/security.md)
    headers = {**box_headers(), "X-Fleetllm-Report-Key": served["report_key"]}
    took = client.post("/vllm/report", json=report, headers=headers, environ_base={"REMOTE_ADDR": PEER})
    assert took.status_code == 200
    latest = runtime.store.latest_report(KNOWN_BOX)
    assert latest is not None and latest.runs_nothing() and latest.revision == r2

    retired = Retirement(KNOWN_BOX, r2, now, RetireState.RETIRED, r1, now, now + 1, "it reported that it runs no server")
    save(runtime, r2, {}, retired)
    # A pass that saw it retired (without one the strip counts "no reconcile pass recorded yet": the boxes of
    # a fleet without LiteLLM are rolled out by the reconciler).
    runtime.store.record_pass(PassRecord(runtime.clock(), 0.4, r2, PassMode.APPLY.value, {"Healthy": 1}))
    gone = fetch(client)
    assert gone.status_code == 404 and "was retired" in gone.get_json()["error"] and r2[:12] in gone.get_json()["error"]
    assert runtime.store.attention() == []  # never an unknown box
    view = client.get("/api/attention", headers={"Authorization": f"Bearer {VIEWER_TOKEN}"}).get_json()
    assert view["unknown_boxes"] == [] and view["count"] == 0
    assert [(r["box"], r["state"], r["revision"]) for r in view["retired"]] == [(KNOWN_BOX, "retired", r2)]
    login(client, VIEWER_TOKEN)
    page = client.get("/").get_data(as_text=True)
    assert "Nothing needs attention" in page and 'data-kind="retired-box"' in page and "Unknown box" not in page


def test_a_box_the_control_plane_never_knew_is_still_unknown(runtime: Runtime, client: FlaskClient) -> None:
    assert fetch(client, host="198.51.100.77").status_code == 404
    assert [e.box for e in runtime.store.attention()] == ["198.51.100.77"]


def test_rollout_forget_through_the_admin_api(runtime: Runtime, client: FlaskClient, fleet_git: Path) -> None:
    operator = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}
    placed = client.post("/admin/rollout/forget", json={"box": KNOWN_BOX}, headers=operator)
    assert placed.status_code == 409 and "remove it from placement.yaml" in placed.get_json()["error"]
    assert client.post("/admin/rollout/forget", json={"box": "198.51.100.77"}, headers=operator).status_code == 404
    assert client.post("/admin/rollout/forget", json={}, headers=operator).status_code == 400
    viewer = {"Authorization": f"Bearer {VIEWER_TOKEN}"}
    assert client.post("/admin/rollout/forget", json={"box": KNOWN_BOX}, headers=viewer).status_code == 403

    r1 = git(fleet_git, "rev-parse", "HEAD")
    runtime.store.record_report(BoxReport(KNOWN_BOX, runtime.clock(), PEER, r1, "test", ReportOutcome.INSTALLED,
                                          freeze_mapping({"agent": True})), keep=5)
    save(runtime, r1, {KNOWN_BOX: BoxRelease(KNOWN_BOX, r1, r1, 1.0, BoxState.APPLIED)}, None)
    r2 = remove_box(fleet_git)
    assert runtime.tracker.refresh()
    done = client.post("/admin/rollout/forget", json={"box": KNOWN_BOX}, headers=operator)
    assert done.status_code == 200, done.get_json()
    assert done.get_json()["retirement"]["state"] == "retired" and done.get_json()["by"] == f"token:{OPERATOR_NAME}"
    assert runtime.store.box_release(KNOWN_BOX) is None
    assert runtime.store.retirements()[KNOWN_BOX].revision == r2
    audit = runtime.store.control_audit(5)[0]
    assert (str(audit.action), audit.actor, audit.revision) == ("rollout-forget", f"token:{OPERATOR_NAME}", r2)
    assert fetch(client).status_code == 404 and runtime.store.attention() == []
