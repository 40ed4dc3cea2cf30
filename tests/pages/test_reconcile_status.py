"""The reconciler as the attention strip reports it (failing, blocked, overdue, never run), and the
revision view's links to the repository's site."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from flask.testing import FlaskClient

from fleetllm.adapters.state.passes import ActionRecord, PassRecord
from fleetllm.server.pages.attention import overdue_after
from fleetllm.server.pages.inputs import gather
from fleetllm.server.pages.revisionview import revision_view, web_url
from fleetllm.server.pages.routes import ago
from tests.pages.conftest import LogCapture, World, build_world, login
from tests.server.conftest import VIEWER_TOKEN


def reconcile_issues(client: FlaskClient) -> dict[str, dict[str, object]]:
    return {r["state"]: r for r in client.get("/api/attention").get_json()["reconcile"]}


def test_a_failing_pass_is_shown_with_its_errors(world: World, viewer: FlaskClient) -> None:
    served = world.runtime.tracker.served
    assert served is not None
    world.runtime.store.record_pass(PassRecord(
        world.clock.now, 0.4, served.revision, "apply", {"Healthy": 1},
        (ActionRecord("delete", "fleetllm:127.0.0.9:8001", False, "failed", "LiteLLM: HTTP 503"),),
        ("vast listing: HTTP 500",), ("no deletes while an observation failed (vast listing: HTTP 500)",)))
    issues = reconcile_issues(viewer)
    assert set(issues) == {"failing", "blocked"}
    assert issues["failing"]["errors"] == ["vast listing: HTTP 500"]
    assert issues["failing"]["failed_actions"] == [{"kind": "delete", "id": "fleetllm:127.0.0.9:8001", "ok": False,
                                                    "outcome": "failed", "error": "LiteLLM: HTTP 503"}]
    page = viewer.get("/").get_data(as_text=True)
    assert "the last reconcile pass failed: 1 observation error(s), 1 failed LiteLLM write(s)" in page
    assert "delete fleetllm:127.0.0.9:8001: failed: LiteLLM: HTTP 503" in page
    history = viewer.get("/history").get_data(as_text=True)
    assert 'class="pass failed"' in history and "deletes blocked:" in history


def test_an_overdue_pass_needs_attention(world: World, viewer: FlaskClient) -> None:
    served = world.runtime.tracker.served
    assert served is not None
    late = overdue_after(served.fleet.settings.reconcile)
    assert late == 2 * 60 + 60
    world.clock.now += late - 1
    assert reconcile_issues(viewer) == {}
    world.clock.now += 2
    issues = reconcile_issues(viewer)
    assert list(issues) == ["overdue"]
    assert "is `fleetllm reconcile` running?" in str(issues["overdue"]["message"])
    assert "Reconcile overdue" in viewer.get("/models").get_data(as_text=True)


def test_a_dry_run_is_judged_and_shows_what_it_would_write(tmp_path: Path, logs: LogCapture) -> None:
    world = build_world(tmp_path, config={"reconcile": {"dry_run": True}})
    try:
        seeded = dict(world.litellm.rows)
        assert world.litellm.writes == [] and world.litellm.rows == seeded  # nothing written
        planned = {(a.kind, a.id) for a in world.outcomes[-1].plan.actions}
        assert planned, "the scenario plans writes"
        client = world.app.test_client()
        login(client, VIEWER_TOKEN)
        passes = client.get("/api/passes").get_json()["passes"]
        assert [p["mode"] for p in passes] == ["plan", "plan"]
        assert {(a["kind"], a["id"]) for a in passes[0]["actions"]} == {(str(k), i) for k, i in planned}
        assert {a["outcome"] for a in passes[0]["actions"]} == {"planned, not applied"}
        fleet = client.get("/").get_data(as_text=True)
        assert "a dry run: LiteLLM was not written" in fleet
        assert "Healthy" in fleet and "Stalled" in fleet  # judged, with the histories kept between passes
        history = client.get("/history").get_data(as_text=True)
        assert "dry run: nothing written" in history and "planned, not applied" in history
        assert reconcile_issues(client) == {}
        attention = client.get("/api/attention").get_json()
        # The servers the dry run would create deployments for: callers cannot reach them, so not "Nothing".
        assert [h for h in attention["held"] if "Healthy server(s) have no LiteLLM deployment" in h], attention
        assert attention["held"][0].endswith("and the reconciler runs dry: callers cannot reach them")
        assert attention["dry_run"].startswith("Dry run: the reconciler writes nothing to LiteLLM and releases nothing")
        for page in ("/", "/models", "/history"):  # said on every page
            assert "Dry run: the reconciler writes nothing" in client.get(page).get_data(as_text=True)
        world.clock.now += overdue_after(world.runtime.tracker.served.fleet.settings.reconcile) + 1  # type: ignore[union-attr]
        assert list(reconcile_issues(client)) == ["overdue"]  # a dry-run reconciler is expected to run too
    finally:
        world.runtime.stop()


@pytest.mark.parametrize(("url", "web"), [
    ("https://github.com/acme/fleet.git", "https://github.com/acme/fleet"),
    ("https://x-access-token:ghs_secret@github.com/acme/fleet.git", "https://github.com/acme/fleet"),
    ("git@github.com:acme/fleet.git", "https://github.com/acme/fleet"),
    ("ssh://git@gitlab.example.com:2222/ops/fleet.git", "https://gitlab.example.com/ops/fleet"),
    ("http://gitea.local:3000/ops/fleet/", "http://gitea.local:3000/ops/fleet"),
    ("/srv/git/fleet.git", None), ("file:///srv/git/fleet.git", None), ("", None), (None, None),
    ("https://github.com/", None), ("https://github.com/acme/fleet?x=<script>", "https://github.com/acme/fleet"),
    ("https://github.com/acme/fl\"eet", None), ("javascript:alert(1)", None),
])
def test_web_url_of_a_remote(url: str | None, web: str | None) -> None:
    assert web_url(url) == web


def test_revision_links_when_a_repo_url_is_configured(world: World) -> None:
    inputs = gather(world.runtime)
    served = inputs.served
    assert served is not None
    for url, compare in (("git@github.com:acme/fleet.git", "https://github.com/acme/fleet/compare/"),
                         ("https://gitlab.com/acme/fleet.git", "https://gitlab.com/acme/fleet/-/compare/")):
        view = revision_view(dataclasses.replace(inputs, settings=dataclasses.replace(inputs.settings, repo_url=url)))
        [diff] = view.diffs
        assert diff.link == f"{compare}{served.revision}...{world.bad_commit}"
        assert [link.label for link in view.links] == [f"commit {served.revision[:12]}",
                                                       f"commit {world.bad_commit[:12]}"]


@pytest.mark.parametrize(("seconds", "text"), [
    (None, "never"), (-5, "0 s ago"), (59.9, "59 s ago"), (119, "119 s ago"), (120, "2 min ago"),
    (7199, "119 min ago"), (7200, "2 h ago"), (172800, "2 days ago"),
])
def test_ages_read_naturally(seconds: float | None, text: str) -> None:
    assert ago(seconds) == text


def test_a_pass_that_ran_on_the_last_valid_commit_names_the_invalid_head(world: World, viewer: FlaskClient) -> None:
    served = world.runtime.tracker.served
    assert served is not None
    head = "f" * 40
    world.runtime.store.record_pass(PassRecord(world.clock.now, 0.4, served.revision, "apply", {"Healthy": 1},
                                               head=head, head_errors=("placement.yaml:3: unknown model",)))
    page = viewer.get("/").get_data(as_text=True)
    assert "is not valid, so it ran on the last valid commit" in page
    assert head[:12] in page
    world.runtime.store.record_pass(PassRecord(world.clock.now + 1, 0.4, served.revision, "apply", {"Healthy": 1}))
    assert "is not valid, so it ran on the last valid commit" not in viewer.get("/").get_data(as_text=True)


def _with_rollout(world: World, mode: str, state: str, boxes: dict[str, str]) -> None:
    from fleetllm.adapters.state.passes import RolloutPassRecord

    served = world.runtime.tracker.served
    assert served is not None
    world.runtime.store.record_pass(PassRecord(world.clock.now, 0.4, served.revision, mode, {"Healthy": 1}, (), (), (),
                                               rollout=RolloutPassRecord(served.revision, state, waves=1, boxes=boxes)))


@pytest.mark.parametrize(("mode", "state", "why"), [
    ("plan", "running", "the reconciler runs dry, so it releases nothing to the boxes and writes nothing to LiteLLM"),
    ("suspended", "running", "the fleet is suspended (`fleetllm resume` ends it)"),
    ("apply", "paused", "its rollout is paused (`fleetllm rollout resume`, or a new commit)"),
])
def test_a_commit_that_does_not_reach_the_boxes_needs_attention_in_every_mode(
        world: World, viewer: FlaskClient, mode: str, state: str, why: str) -> None:
    _with_rollout(world, mode, state, {"127.0.0.2": "waiting", "127.0.0.3": "applied"})
    attention = viewer.get("/api/attention").get_json()
    served = world.runtime.tracker.served
    assert served is not None
    assert attention["held"] == [f"commit {served.revision[:12]} is held: {why}; 1 box(es) not on it (127.0.0.2)"
                                 + (". Set reconcile.dry_run to false" if mode == "plan" else "")]
    assert attention["count"] >= 1
    page = viewer.get("/").get_data(as_text=True)
    assert "Nothing needs attention" not in page and "Commit held" in page


def test_a_running_rollout_is_shown_on_every_page_and_a_converged_one_holds_nothing(
        world: World, viewer: FlaskClient) -> None:
    _with_rollout(world, "apply", "running", {"127.0.0.2": "draining", "127.0.0.3": "applied"})
    attention = viewer.get("/api/attention").get_json()
    assert attention["held"] == [] and attention["dry_run"] == ""
    assert attention["rolling"].endswith(": wave 1; boxes: 1 applied, 1 draining")
    assert "Rolling out " in viewer.get("/models").get_data(as_text=True)
    _with_rollout(world, "plan", "converged", {"127.0.0.2": "applied"})
    attention = viewer.get("/api/attention").get_json()
    assert attention["held"] == [] and attention["rolling"] == ""


def test_without_litellm_the_fleet_page_says_the_boxes_route(tmp_path: Path, logs: LogCapture) -> None:
    from fleetllm.adapters.state.passes import ServerRecord

    world = build_world(tmp_path, config={"litellm": None}, passes=0)
    try:
        served = world.runtime.tracker.served
        assert served is not None
        box = next(iter(served.fleet.boxes.values()))
        row = box.servers[0]
        world.runtime.store.record_pass(PassRecord(
            world.clock.now, 0.2, served.revision, "apply", {"Healthy": 1},
            servers=(ServerRecord(box.name, row.port, row.name, row.model, "Healthy", "serves", deployment=None),)))
        client = world.app.test_client()
        login(client, VIEWER_TOKEN)
        page = client.get("/").get_data(as_text=True)
        assert "none: the boxes route" in page and ">unknown<" not in page
    finally:
        world.runtime.stop()


def test_failing_and_slow_rentals_need_attention(world: World, viewer: FlaskClient) -> None:
    """Issue 25: capacity the reconcile loop could not rent (backing off) and a rental whose box never presented
    itself are on the attention list, counted, with what to do; a rental heard of in time is not."""
    from fleetllm.core.capacity import SLOW_RENTAL_S, Attempts, RentalWait
    from fleetllm.core.fleet.model import Provider

    now = world.clock.now
    before = viewer.get("/api/attention").get_json()
    assert before["capacity"] == []
    world.runtime.store.save_capacity(
        Attempts({"fleetllm-h100-2": (3, now - 10, "RunPod POST /v2/pods (fleetllm-h100-2): HTTP 500")}),
        {"fleetllm-h100-1": RentalWait("fleetllm-h100-1", Provider.RUNPOD, "k7v2m9x4q1w8e3", now - SLOW_RENTAL_S),
         "fleetllm-h100-3": RentalWait("fleetllm-h100-3", Provider.RUNPOD, "p3", now - 60)})
    after = viewer.get("/api/attention").get_json()
    assert [(c["kind"], c["subject"]) for c in after["capacity"]] == [("failing", "fleetllm-h100-2"),
                                                                      ("slow", "fleetllm-h100-1")]
    assert after["count"] == before["count"] + 2
    failing, slow = (c["text"] for c in after["capacity"])
    assert failing == ("rent fleetllm-h100-2 failed 3 time(s), last at 10 s ago: RunPod POST /v2/pods "
                       "(fleetllm-h100-2): HTTP 500; tried again in 230 s")  # the third back-off: 240 s
    assert "k7v2m9x4q1w8e3" in slow and "has not fetched its config" in slow and "lower its pool's count" in slow
    page = viewer.get("/").get_data(as_text=True)
    assert 'data-kind="capacity-failing"' in page and 'data-kind="capacity-slow"' in page and "Rental slow" in page
