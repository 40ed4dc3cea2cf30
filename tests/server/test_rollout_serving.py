"""GET /vllm/config under staged rollouts, through the real Flask app over a real git repository and the
real state store: an agent box is served the revision it is released (rendered from git by SHA), every
other box the newest valid commit exactly as before; /health shows the rollout."""

from __future__ import annotations

from pathlib import Path

import pytest
from flask.testing import FlaskClient

from fleetllm.core.boxreport import BoxReport
from fleetllm.core.fleet.jsonvalue import freeze_mapping
from fleetllm.core.rollout.model import BoxRelease, BoxState, Rollout, RolloutState
from fleetllm.server.runtime import Runtime
from fleetllm_contract.report import ReportOutcome
from tests.conftest import git
from tests.server.conftest import KNOWN_BOX, box_headers


@pytest.fixture(autouse=True)
def fresh_releases(monkeypatch: pytest.MonkeyPatch) -> None:
    """Config requests read releases at most once a second; these tests write and read at once."""
    import fleetllm.server.rollouts as rollouts

    monkeypatch.setattr(rollouts, "CACHE_TTL_S", 0.0)


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
    assert rollout["boxes"] == {"waiting": 1}  # counted: /health is public, the boxes are not listed
    assert KNOWN_BOX not in client.get("/health").get_data(as_text=True)


def admin(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_the_admin_api_shows_the_rollout_and_records_requests(runtime: Runtime, client: FlaskClient) -> None:
    from tests.server.conftest import ADMIN_TOKEN, VIEWER_TOKEN

    assert client.get("/admin/rollout", headers=admin(VIEWER_TOKEN)).get_json() == {"rollout": None, "history": []}
    none_yet = client.post("/admin/rollout/pause", headers=admin(ADMIN_TOKEN))
    assert none_yet.status_code == 409 and "no rollout yet" in none_yet.get_json()["error"]
    served = runtime.tracker.served
    assert served is not None
    release(runtime, served.revision, served.revision)
    assert client.post("/admin/rollout/pause", headers=admin(VIEWER_TOKEN)).status_code == 403
    assert client.post("/admin/rollout/resume", headers=admin(ADMIN_TOKEN)).status_code == 409  # it runs
    paused = client.post("/admin/rollout/pause", headers=admin(ADMIN_TOKEN))
    assert paused.status_code == 202 and paused.get_json()["requested"] == "pause"
    assert paused.get_json()["rollout"]["requested"]["request"] == "pause"
    assert ADMIN_TOKEN not in paused.get_data(as_text=True)
    # The pending pause counts: pausing again is refused, resuming is accepted.
    assert client.post("/admin/rollout/pause", headers=admin(ADMIN_TOKEN)).status_code == 409
    assert client.post("/admin/rollout/resume", headers=admin(ADMIN_TOKEN)).status_code == 202
    assert client.post("/admin/rollout/reboot", headers=admin(ADMIN_TOKEN)).status_code == 404
    view = client.get("/admin/rollout", headers=admin(VIEWER_TOKEN)).get_json()
    assert view["rollout"]["requested"]["request"] == "resume" and len(view["history"]) == 1


def test_a_populated_rollout_view_matches_the_openapi_document(runtime: Runtime, client: FlaskClient) -> None:
    import jsonschema
    import yaml

    from tests.conftest import ROOT
    from tests.server.conftest import ADMIN_TOKEN, VIEWER_TOKEN

    document = yaml.safe_load((ROOT / "schemas" / "openapi.yaml").read_text())
    served = runtime.tracker.served
    assert served is not None
    release(runtime, served.revision, served.revision)
    report(runtime, served.revision, agent=True)
    accepted = client.post("/admin/rollout/abort", headers=admin(ADMIN_TOKEN))
    view = client.get("/admin/rollout", headers=admin(VIEWER_TOKEN)).get_json()
    assert view["rollout"]["boxes"][KNOWN_BOX]["state"] == "waiting"
    for body, name in ((view, "RolloutView"),):
        jsonschema.validate(body, {**document, "$ref": f"#/components/schemas/{name}"})
    answer = document["paths"]["/admin/rollout/{action}"]["post"]["responses"]["202"]["content"]
    jsonschema.validate(accepted.get_json(), {**document, **answer["application/json"]["schema"]})


def test_the_revision_page_and_the_attention_strip_show_a_halt(runtime: Runtime, client: FlaskClient) -> None:
    from fleetllm.adapters.state.passes import PassRecord, RolloutPassRecord
    from tests.server.conftest import VIEWER_TOKEN

    served = runtime.tracker.served
    assert served is not None
    runtime.store.save_rollout(Rollout(served.revision, RolloutState.HALTED, 1.0, 2.0, waves=1,
                                       reason="box 203.0.113.24: server(s) qwen3-8b crash-loop"),
                               {KNOWN_BOX: BoxRelease(KNOWN_BOX, "a" * 40, "a" * 40, 2.0, BoxState.HALTED,
                                                      wave=1, reason="rolled back to aaaaaaaaaaaa")})
    runtime.store.record_pass(PassRecord(runtime.clock(), 0.1, served.revision, "apply", {}, rollout=RolloutPassRecord(
        served.revision, "halted", "box 203.0.113.24: server(s) qwen3-8b crash-loop", 1,
        boxes={KNOWN_BOX: "halted"}, halt="box 203.0.113.24: server(s) qwen3-8b crash-loop")))
    from tests.pages.conftest import login

    login(client, VIEWER_TOKEN)
    page = client.get("/revision")
    assert page.status_code == 200
    html = page.get_data(as_text=True)
    assert '<h2 id="rollout">Rollout</h2>' in html and 'class="bad-text">halted</strong>' in html
    assert f'<tr data-box="{KNOWN_BOX}">' in html and "rolled back to aaaaaaaaaaaa" in html
    assert "reconcile-rollout-halted" in html and "crash-loop" in html
    strip = client.get("/api/attention", headers=admin(VIEWER_TOKEN)).get_json()
    assert [r["state"] for r in strip["reconcile"]] == ["rollout-halted"]


def test_before_the_first_pass_an_agent_box_keeps_what_it_reported(runtime: Runtime, client: FlaskClient,
                                                                    fleet_git: Path) -> None:
    r1 = git(fleet_git, "rev-parse", "HEAD")
    r2 = commit(fleet_git, "models.yaml", "max-num-batched-tokens: 4096", "max-num-batched-tokens: 8192", "boot")
    assert runtime.tracker.refresh()
    report(runtime, r1, agent=True)  # no release recorded yet: a commit merged meanwhile must not reach it
    assert fetch(client).get_json()["revision"] == r1
    # A box placed only at the head (approved after it installed) gets the head.
    r3 = commit(fleet_git, "placement.yaml", "  203.0.113.24:\n", "  203.0.113.77:\n    - [qwen3-8b, 8001]\n\n"
                "  203.0.113.24:\n", "place a new box")
    assert runtime.tracker.refresh()
    runtime.store.record_report(BoxReport("203.0.113.77", runtime.clock(), "192.0.2.51", r2, "test",
                                          ReportOutcome.INSTALLED, freeze_mapping({"agent": True})), keep=5)
    new = client.get("/vllm/config", headers=box_headers("203.0.113.77"), environ_base={"REMOTE_ADDR": "192.0.2.51"})
    assert new.status_code == 200 and new.get_json()["revision"] == r3


def test_config_requests_keep_the_last_releases_while_the_store_is_down(monkeypatch: pytest.MonkeyPatch) -> None:
    import fleetllm.server.rollouts as rollouts
    from fleetllm.errors import StateError

    class Store:
        down = False
        reads = 0

        def box_releases(self) -> dict[str, BoxRelease]:
            self.reads += 1
            if self.down:
                raise StateError("connection refused")
            return {"b": BoxRelease("b", "r1", "r1", 1.0, BoxState.APPLIED)}

        def latest_reports(self) -> dict[str, BoxReport]:
            return {"b": BoxReport("b", 1.0, "p", "r1", "t", ReportOutcome.INSTALLED, freeze_mapping({"agent": True}))}

        def retirements(self) -> dict[str, object]:
            return {}

    monkeypatch.setattr(rollouts, "CACHE_TTL_S", 0.0)
    store = Store()
    cache = rollouts.ReleaseCache(store)  # type: ignore[arg-type]
    assert cache.get() == rollouts.ReleaseView({"b": "r1"}, {"b": "r1"}, {"b": "r1"})
    store.down = True
    assert cache.get() == rollouts.ReleaseView({"b": "r1"}, {"b": "r1"}, {"b": "r1"})  # the last known, not an error
    reads = store.reads
    for _ in range(100):
        cache.get()
    assert store.reads == reads  # not retried on every request while it is down (RETRY_AFTER_S)
    assert rollouts.ReleaseCache(store).get() is None  # never read: the head is served, as before  # type: ignore[arg-type]


def test_a_request_that_finds_the_releases_expired_waits_for_the_read_under_way(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The event loop reads the releases on a thread and hands a request whose view has expired to another
    thread: that request must be answered from the read under way, never from the expired view (the
    store written a second before must be seen: tests/server/test_rollout_process.py's promise)."""
    import threading

    import fleetllm.server.rollouts as rollouts

    class SignallingLock:
        """threading.Lock that says when a thread other than the reader asks for it."""

        def __init__(self) -> None:
            self.inner = threading.Lock()
            self.asked = threading.Event()
            self.reader: threading.Thread | None = None

        def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
            if threading.current_thread() is not self.reader:
                self.asked.set()
            return self.inner.acquire(blocking, timeout)

        def release(self) -> None:
            self.inner.release()

        def locked(self) -> bool:
            return self.inner.locked()

    class Store:
        revision = "r1"
        hold: threading.Event | None = None
        reading = threading.Event()  # a held read has begun
        reads = 0

        def box_releases(self) -> dict[str, BoxRelease]:
            self.reads += 1
            if self.hold is not None:
                self.reading.set()
                self.hold.wait(10)
            return {"b": BoxRelease("b", self.revision, self.revision, 1.0, BoxState.APPLIED)}

        def latest_reports(self) -> dict[str, BoxReport]:
            return {"b": BoxReport("b", 1.0, "p", "r1", "t", ReportOutcome.INSTALLED, freeze_mapping({"agent": True}))}

        def retirements(self) -> dict[str, object]:
            return {}

    monkeypatch.setattr(rollouts, "CACHE_TTL_S", 60.0)
    monkeypatch.setattr(rollouts, "READ_WAIT_S", 60.0)  # (a read that hangs: the next test)
    store = Store()
    cache = rollouts.ReleaseCache(store)  # type: ignore[arg-type]
    lock = SignallingLock()
    cache.lock = lock  # type: ignore[assignment]
    assert cache.get() is not None and cache.get().releases == {"b": "r1"}  # type: ignore[union-attr]
    cache.next_read = cache.refresh_at = 0.0  # a minute later: expired
    assert not cache.fresh()
    store.revision, store.hold = "r2", lock.asked  # the store written; its next read ends once the request waits
    assert cache.claim_refresh()
    lock.asked.clear()
    reader = lock.reader = threading.Thread(target=cache.refresh)
    reader.start()
    assert store.reading.wait(10)  # the background read holds the lock
    view = cache.get()
    reader.join(10)
    assert view is not None and view.releases == {"b": "r2"}
    assert store.reads == 2  # the request used the read under way, new enough, and did not read again
    assert not cache.claimed  # the next background read can be claimed


def test_a_request_waits_a_bounded_time_for_a_read_of_a_store_that_hangs(monkeypatch: pytest.MonkeyPatch) -> None:
    """A store that hangs in the middle of a read must not hold every request thread: after READ_WAIT_S a
    request answers from the last view, as it does while the store fails."""
    import threading

    import fleetllm.server.rollouts as rollouts

    class Store:
        hang = threading.Event()
        hung = threading.Event()
        release = threading.Event()
        reads = 0

        def box_releases(self) -> dict[str, BoxRelease]:
            self.reads += 1
            if self.hang.is_set():
                self.hung.set()
                self.release.wait(30)
            return {"b": BoxRelease("b", "r1", "r1", 1.0, BoxState.APPLIED)}

        def latest_reports(self) -> dict[str, BoxReport]:
            return {}

        def retirements(self) -> dict[str, object]:
            return {}

    monkeypatch.setattr(rollouts, "READ_WAIT_S", 0.05)
    store = Store()
    cache = rollouts.ReleaseCache(store)  # type: ignore[arg-type]
    first = cache.get()
    store.hang.set()
    reader = threading.Thread(target=cache.refresh)
    reader.start()
    try:
        assert store.hung.wait(10)  # the second read holds the lock, hung
        assert cache.get() is first  # the last view (CACHE_TTL_S is 0 here), not a wait for the hung read
        assert store.reads == 2
    finally:
        store.release.set()
        reader.join(10)
