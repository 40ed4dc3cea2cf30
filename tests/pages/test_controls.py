"""The fleet controls on the status pages and the admin API (issue 18.4): the banner on every page
(suspended, pinned in red, with who/when/why, and the audit trail), the admin's forms (CSRF-checked,
refused to a viewer), the API's refusals, and /health."""

from __future__ import annotations

from flask.testing import FlaskClient

from fleetllm.server.auth import token_fingerprint
from tests.conftest import git
from tests.pages.conftest import World, csrf_of, login
from tests.server.conftest import ADMIN_TOKEN, METRICS_TOKEN, VIEWER_TOKEN

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
VIEWER = {"Authorization": f"Bearer {VIEWER_TOKEN}"}
PAGES = ("/", "/models", "/revision", "/history")
METRICS = {"Authorization": f"Bearer {METRICS_TOKEN}"}  # metrics_token of the pages' world


def test_every_page_shows_a_suspension_and_a_pin_in_red(world: World, viewer: FlaskClient) -> None:
    for path in PAGES:
        assert "data-kind=\"suspended\"" not in viewer.get(path).get_data(as_text=True)
    client = world.app.test_client()
    served = world.runtime.tracker.served
    assert served is not None
    assert client.post("/admin/suspend", json={"reason": "LiteLLM upgrade"}, headers=ADMIN).status_code == 200
    answer = client.post("/admin/pin", json={"revision": served.revision[:8], "reason": "hold still"}, headers=ADMIN)
    assert answer.status_code == 200, answer.get_json()
    assert answer.get_json()["revision"] == served.revision
    actor = "admin:" + token_fingerprint(ADMIN_TOKEN)
    for path in PAGES:
        html = viewer.get(path).get_data(as_text=True)
        assert 'data-kind="suspended"' in html and "LiteLLM upgrade" in html and actor in html, path
        assert 'class="control-state tone-bad pin" data-kind="pinned"' in html and "hold still" in html, path
        assert "Sync now" not in html  # a viewer sees, does not act
    fragment = viewer.get("/?fragment=1").get_data(as_text=True)
    assert 'data-kind="pinned"' in fragment  # the live refresh keeps the banner
    health = client.get("/health").get_json()["control"]
    assert health["suspended"] is True and health["pinned_revision"] == served.revision
    assert health["suspended_by"] == actor
    metrics = client.get("/metrics", headers=METRICS).get_data(as_text=True)
    assert "fleetllm_suspended 1.0" in metrics and "fleetllm_pinned 1.0" in metrics
    control = client.get("/admin/control", headers=VIEWER).get_json()
    assert [e["action"] for e in control["audit"]] == ["pin", "suspend"]
    assert control["pin"]["reason"] == "hold still"


def test_the_admin_forms_are_csrf_checked(world: World) -> None:
    admin = world.app.test_client()
    assert login(admin, ADMIN_TOKEN).status_code == 302
    page = admin.get("/").get_data(as_text=True)
    assert "Sync now" in page and "Suspend the fleet" in page and "Pin every box to it" in page
    csrf = csrf_of(page)
    refused = admin.post("/control/sync", data={"csrf": "forged", "next": "/models"})
    assert refused.status_code == 302 and refused.headers["Location"] == "/models"
    assert world.runtime.store.control().sync is None
    assert admin.post("/control/sync", data={"csrf": csrf, "next": "/"}).status_code == 302
    assert world.runtime.store.control().sync is not None
    admin.post("/control/suspend", data={"csrf": csrf, "reason": "page", "next": "/"})
    assert world.runtime.store.control().suspended is not None
    html = admin.get("/").get_data(as_text=True)
    assert "The fleet is suspended" in html and ">Resume</button>" in html
    admin.post("/control/resume", data={"csrf": csrf, "next": "/"})
    assert world.runtime.store.control().suspended is None
    admin.post("/control/pin", data={"csrf": csrf, "revision": world.bad_commit, "reason": "x", "next": "/"})
    html = admin.get("/").get_data(as_text=True)
    assert "Not pinned:" in html and "is not a valid fleet revision" in html
    assert world.runtime.store.control().pin is None
    good = git(world.repo, "rev-parse", "main~1")
    admin.post("/control/pin", data={"csrf": csrf, "revision": good, "reason": "x", "next": "/"})
    assert world.runtime.tracker.pin is not None and world.runtime.tracker.pin.revision == good
    admin.post("/control/unpin", data={"csrf": csrf, "next": "/"})
    assert world.runtime.tracker.pin is None


def test_a_viewer_cannot_act(world: World, viewer: FlaskClient) -> None:
    csrf = csrf_of(viewer.get("/").get_data(as_text=True))
    viewer.post("/control/suspend", data={"csrf": csrf, "next": "/"})
    assert world.runtime.store.control().suspended is None
    client = world.app.test_client()
    for path in ("/admin/sync", "/admin/suspend", "/admin/resume", "/admin/pin", "/admin/unpin"):
        assert client.post(path, json={}, headers=VIEWER).status_code == 403, path
        assert client.post(path, json={}).status_code == 401, path
    assert world.runtime.store.control_audit() == []


def test_the_api_refuses_bad_requests_clearly(world: World) -> None:
    client = world.app.test_client()
    for body, status, says in (({}, 400, '"revision"'), ({"revision": "--upload-pack=touch /tmp/x"}, 400,
                                                          "give a commit of the tracked branch"),
                               ({"revision": "f" * 40}, 404, "no such commit"),
                               ({"revision": "0" * 40}, 404, "no such commit"),
                               ({"revision": world.bad_commit}, 409, "is not a valid fleet revision"),
                               ({"revision": "HEAD~1", "reason": 7}, 400, '"reason" must be a string')):
        answer = client.post("/admin/pin", json=body, headers=ADMIN)
        assert answer.status_code == status, (body, answer.get_json())
        assert says in answer.get_json()["error"]
    answer = client.post("/admin/suspend", data="not json", headers={**ADMIN, "Content-Type": "application/json"})
    assert answer.status_code == 400
    assert world.runtime.store.control_audit() == []
    assert client.post("/admin/resume", headers=ADMIN).get_json()["status"] == "not suspended"
    assert client.post("/admin/unpin", headers=ADMIN).get_json()["status"] == "not pinned"


def test_sync_requests_are_rate_limited_and_a_refusal_leaves_no_record(world: World) -> None:
    client = world.app.test_client()
    answers = [client.post("/admin/sync", json={"reason": f"try {i}"}, headers=ADMIN) for i in range(8)]
    codes = [a.status_code for a in answers]
    assert codes[:5] == [202] * 5 and 429 in codes[5:]
    refused = next(a for a in answers if a.status_code == 429)
    assert int(refused.headers["Retry-After"]) >= 1 and "too many sync requests" in refused.get_json()["error"]
    assert len([e for e in world.runtime.store.control_audit(limit=100) if e.action.value == "sync"]) == codes.count(202)
    assert client.post("/admin/suspend", json={"reason": "still possible"}, headers=ADMIN).status_code == 200
