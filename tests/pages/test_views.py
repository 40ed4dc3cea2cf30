"""Every page and API over the scenario's real state (tests/pages/scenario.py): what each shows."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from flask.testing import FlaskClient

from fleetllm.server.pages.fleetview import Fit, FleetFilter, fleet_view, needs_attention
from fleetllm.server.pages.inputs import gather
from tests.pages.conftest import World
from tests.pages.scenario import (
    BAD_MODEL_ERROR,
    FIT_PROBLEM,
    FOREIGN_BOX,
    HEALTHY_BOX,
    MANUAL_ID,
    OTHER_ID,
    PENDING_BOX,
    STALLED_BOX,
    UNKNOWN_BOX,
)


def servers_of(fleet: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f"{b['name']}:{s['listen_port']}": s for b in fleet["boxes"] for s in b["servers"]}


def text_of(html: str) -> str:
    """The visible text, whitespace collapsed (to check what a reader sees, not the markup)."""
    spaced = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))
    return re.sub(r"\s+([:,.;)])", r"\1", re.sub(r"([(])\s+", r"\1", spaced)).strip()


def test_fleet_api_joins_repository_records_and_the_last_pass(viewer: FlaskClient, world: World) -> None:
    port, port2 = world.ports
    fleet = viewer.get("/api/fleet").get_json()
    served = world.runtime.tracker.served
    assert served is not None
    assert fleet["revision"] == served.revision != world.bad_commit
    assert fleet["last_pass"]["revision"] == served.revision
    assert fleet["last_pass"]["ok"] is True
    assert fleet["verdicts"] == {"Foreign": 1, "Healthy": 1, "Pending": 1, "Stale": 1, "Stalled": 1}
    assert [b["name"] for b in fleet["boxes"]] == [HEALTHY_BOX, STALLED_BOX, FOREIGN_BOX, PENDING_BOX]
    servers = servers_of(fleet)
    healthy, stale = servers[f"{HEALTHY_BOX}:{port}"], servers[f"{HEALTHY_BOX}:{port2}"]
    assert (healthy["verdict"], healthy["deployment"], healthy["public"]) == ("Healthy", True, f"{HEALTHY_BOX}:{port}")
    assert (healthy["max_model_len"], healthy["served_max_model_len"]) == (4096, 4096)
    assert (stale["verdict"], stale["max_model_len"], stale["served_max_model_len"]) == ("Stale", 4096, 2048)
    assert "must re-fetch and restart" in stale["reason"]
    stalled = servers[f"{STALLED_BOX}:{port}"]
    assert (stalled["verdict"], stalled["deployment"]) == ("Stalled", False)
    assert "never healthy" in stalled["reason"]
    assert servers[f"{FOREIGN_BOX}:{port}"]["verdict"] == "Foreign"
    assert servers[f"{PENDING_BOX}:{port}"]["verdict"] == "Pending"
    boxes = {b["name"]: b for b in fleet["boxes"]}
    assert boxes[HEALTHY_BOX]["fit"] == {"state": "ok", "text": "fits", "problems": []}
    assert boxes[HEALTHY_BOX]["reported_revision"] == boxes[HEALTHY_BOX]["fetched_revision"] == served.revision
    assert boxes[HEALTHY_BOX]["boot_config"] == "current"
    assert boxes[HEALTHY_BOX]["last_fetch_at"] == world.clock.now
    assert boxes[HEALTHY_BOX]["availability"] == "available"
    assert (boxes[STALLED_BOX]["report_outcome"], boxes[STALLED_BOX]["boot_config"]) == ("fit_failed", "not-applied")
    assert boxes[STALLED_BOX]["fit"]["state"] == "failed"
    assert boxes[STALLED_BOX]["fit"]["problems"] == [FIT_PROBLEM]
    assert boxes[PENDING_BOX]["last_fetch_at"] is None
    assert boxes[PENDING_BOX]["fit"]["state"] == "unknown"
    assert boxes[PENDING_BOX]["availability"] == "unavailable"


def test_fleet_page_shows_each_box_and_server(viewer: FlaskClient, world: World) -> None:
    port, port2 = world.ports
    response = viewer.get("/")
    assert response.status_code == 200
    html = response.get_data(as_text=True)
    text = text_of(html)
    for box in (HEALTHY_BOX, STALLED_BOX, FOREIGN_BOX, PENDING_BOX):
        assert f'id="box-{box}"' in html
    for verdict in ("Healthy", "Stale", "Stalled", "Foreign", "Pending"):
        assert f"{verdict} " in text  # the word beside the icon, not only a colour
    row = re.search(rf'<tr data-server="{re.escape(HEALTHY_BOX)}:{port2}">(.*?)</tr>', html, re.S)
    assert row is not None
    cells = text_of(row.group(1))
    assert f"{port2} → {HEALTHY_BOX}:{port2}" in cells
    assert "4096 / 2048" in cells and "differs" in cells
    assert "present" in cells
    stalled_row = re.search(rf'<tr data-server="{re.escape(STALLED_BOX)}:{port}">(.*?)</tr>', html, re.S)
    assert stalled_row is not None and "absent" in text_of(stalled_row.group(1))
    assert f"does not fit: {FIT_PROBLEM}" in text
    assert 'class="badge tone-ok"' in html and "#i-check" in html  # colour, icon and word together
    assert "Verdicts from the reconcile pass" in text


def test_a_box_running_an_older_boot_config_is_behind(viewer: FlaskClient, world: World) -> None:
    from tests.pages.scenario import report_body
    from tests.server.conftest import box_headers

    plane = world.app.test_client()
    config = plane.get("/vllm/config", headers=box_headers(FOREIGN_BOX)).get_json()
    report = report_body(config)
    report["servers"][0]["digest"] = "sha256:" + "0" * 64  # what an older revision rendered for it
    assert plane.post("/vllm/report", json=report, headers=box_headers(FOREIGN_BOX)).status_code == 200
    box = next(b for b in viewer.get("/api/fleet").get_json()["boxes"] if b["name"] == FOREIGN_BOX)
    assert (box["report_outcome"], box["boot_config"]) == ("installed", "stale")
    section = viewer.get("/").get_data(as_text=True).split(f'id="box-{FOREIGN_BOX}"', 1)[1].split("</section>")[0]
    assert "behind the served revision: must re-fetch and restart" in text_of(section)


def test_models_api_and_page_roll_up(viewer: FlaskClient, world: World) -> None:
    port = world.ports[0]
    models = {m["name"]: m for m in viewer.get("/api/models").get_json()["models"]}
    assert models["tiny-a"]["availability"] == "degraded"
    assert (models["tiny-a"]["serving"], models["tiny-a"]["total"]) == (1, 2)
    assert models["tiny-a"]["deployments"] == [f"{HEALTHY_BOX}:{port}"]
    assert models["tiny-a"]["min_context"] == 4096
    assert models["tiny-b"]["min_context"] == 2048  # what the stale server really serves
    assert models["tiny-b"]["verdicts"] == {"Pending": 1, "Stale": 1}
    assert models["slow-c"] == {"name": "slow-c", "availability": "unavailable", "serving": 0, "total": 1,
                                "deployments": [], "min_context": None, "verdicts": {"Stalled": 1},
                                "cost_per_hour": None}
    text = text_of(viewer.get("/models").get_data(as_text=True))
    assert "tiny-a degraded 1 of 2" in text
    assert "slow-c unavailable 0 of 1 none" in text


def test_attention_api_lists_everything_that_needs_an_operator(viewer: FlaskClient, world: World) -> None:
    port = world.ports[0]
    attention = viewer.get("/api/attention").get_json()
    assert [b["box"] for b in attention["unknown_boxes"]] == [UNKNOWN_BOX]
    assert attention["unknown_boxes"][0]["approval"] is None
    assert {(s["box"], s["verdict"]) for s in attention["servers"]} == {
        (HEALTHY_BOX, "Stale"), (STALLED_BOX, "Stalled"), (FOREIGN_BOX, "Foreign")}
    [invalid] = attention["invalid_commits"]
    assert invalid["revision"] == world.bad_commit and invalid["head"] is True
    assert any(BAD_MODEL_ERROR in e for e in invalid["errors"])
    drift = {d["id"]: d for d in attention["drift"]}
    assert drift[MANUAL_ID]["fleet_server"] == f"{HEALTHY_BOX}:{port}"
    assert drift[OTHER_ID]["fleet_server"] is None
    assert [d["id"] for d in attention["drift"]] == [MANUAL_ID, OTHER_ID]  # pointing at the fleet first
    assert attention["duplicates"] == [{"api_base": f"http://{HEALTHY_BOX}:{port}/v1", "model_name": "tiny-a",
                                        "ids": [f"fleetllm:{HEALTHY_BOX}:{port}", MANUAL_ID]}]
    assert attention["reconcile"] == []
    assert attention["count"] == 1 + 3 + 1 + 2 + 1
    assert attention["approve_models"] == ["slow-c", "tiny-a", "tiny-b"]
    assert attention["approve_slots"] == 2


def test_attention_strip_is_on_every_page(viewer: FlaskClient, world: World) -> None:
    for path in ("/", "/models", "/revision", "/history"):
        html = viewer.get(path).get_data(as_text=True)
        text = text_of(html)
        assert "Needs attention: 8" in text, path
        assert f"Unknown box {UNKNOWN_BOX} presented the fleet key 1 time" in text
        assert f"Invalid commit {world.bad_commit[:12]} (head of main) is not served" in text
        assert BAD_MODEL_ERROR.replace("'", "&#39;") in html
        assert f"deployment {MANUAL_ID} (tiny-a)" in text
        assert "Duplicate deployments 2 deployments of tiny-a" in text
        assert "Log in with an admin token to approve it." in text  # a viewer sees no Approve form
        assert 'action="/approve"' not in html


def test_revision_api_and_page(viewer: FlaskClient, world: World) -> None:
    revision = viewer.get("/api/revision").get_json()
    served = world.runtime.tracker.served
    assert served is not None
    assert revision["served"] == served.revision
    assert revision["attempted"]["revision"] == world.bad_commit
    assert revision["attempted"]["valid"] is False
    assert revision["branch"] == "main"
    assert revision["repository"] == str(world.repo)
    [diff] = revision["diffs"]
    assert diff["command"] == f"fleetllm diff {served.revision} {world.bad_commit} --repo {world.repo}"
    assert diff["link"] is None  # a local repository: no site to link to
    text = text_of(viewer.get("/revision").get_data(as_text=True))
    assert diff["command"] in text
    assert "Why the head is not served" in text


def test_history_api_and_page(viewer: FlaskClient, world: World) -> None:
    port, port2 = world.ports
    passes = viewer.get("/api/passes").get_json()["passes"]
    assert len(passes) == 2
    first = passes[-1]
    assert sorted((a["kind"], a["id"], a["outcome"]) for a in first["actions"]) == sorted([
        ("create", f"fleetllm:{HEALTHY_BOX}:{port}", "created"), ("create", f"fleetllm:{HEALTHY_BOX}:{port2}", "created")])
    assert passes[0]["actions"] == []
    assert passes[0]["drift"] == 2
    assert viewer.get("/api/passes?limit=1").get_json()["passes"] == passes[:1]
    for bad in ("0", "201", "x", "-1", "1.5", "²"):
        response = viewer.get(f"/api/passes?limit={bad}")
        assert response.status_code == 400
        assert "limit must be an integer in 1..200" in response.get_json()["error"]
    text = text_of(viewer.get("/history").get_data(as_text=True))
    assert f"create fleetllm:{HEALTHY_BOX}:{port}: created" in text
    assert "The last 2 reconcile passes" in text


def test_fragments_render_the_live_region_only(viewer: FlaskClient) -> None:
    for path in ("/", "/models", "/revision", "/history"):
        whole = viewer.get(path).get_data(as_text=True)
        part = viewer.get(f"{path}?fragment=1").get_data(as_text=True)
        assert "<html" in whole and "<html" not in part and "<header class=\"top\">" not in part
        assert 'class="attention has-items"' in part
        inner = whole.split('<main id="live" data-refresh="15">', 1)[1].split("</main>", 1)[0]
        assert text_of(part) == text_of(inner)


def test_pages_work_without_javascript(viewer: FlaskClient) -> None:
    html = viewer.get("/").get_data(as_text=True)
    assert '<noscript><meta http-equiv="refresh" content="60"></noscript>' in html
    assert '<script src="/pages/static/pages.js" defer></script>' in html
    assert "<script>" not in html  # nothing inline: the CSP allows scripts from the site only
    for asset in ("/pages/static/pages.js", "/pages/static/pages.css"):
        response = viewer.get(asset)
        assert response.status_code == 200
        assert "http://" not in response.get_data(as_text=True) and "https://" not in response.get_data(as_text=True)


def test_no_pass_yet_and_no_reconciler(tmp_path: Any, logs: Any) -> None:
    from tests.pages.conftest import build_world, login
    from tests.server.conftest import VIEWER_TOKEN

    world = build_world(tmp_path / "a", passes=0)
    try:
        client = world.app.test_client()
        login(client, VIEWER_TOKEN)
        fleet = client.get("/api/fleet").get_json()
        assert fleet["last_pass"] is None
        assert {s["verdict"] for b in fleet["boxes"] for s in b["servers"]} == {None}
        assert fleet["verdicts"] == {"Not judged": 5}
        attention = client.get("/api/attention").get_json()
        assert [r["state"] for r in attention["reconcile"]] == ["missing"]
        text = text_of(client.get("/").get_data(as_text=True))
        assert "No reconcile pass recorded yet" in text
        assert "Not judged" in text
    finally:
        world.runtime.stop()
    # Without LiteLLM the reconciler still runs the rollouts (the boxes route): a missing pass is an alarm ...
    unrouted = build_world(tmp_path / "b", passes=0, config={"litellm": None})
    try:
        client = unrouted.app.test_client()
        login(client, VIEWER_TOKEN)
        assert [r["state"] for r in client.get("/api/attention").get_json()["reconcile"]] == ["missing"]
    finally:
        unrouted.runtime.stop()
    # ... unless the reconciler is switched off.
    unconfigured = build_world(tmp_path / "c", passes=0, config={"reconcile": {"enabled": False}})
    try:
        client = unconfigured.app.test_client()
        login(client, VIEWER_TOKEN)
        assert client.get("/api/attention").get_json()["reconcile"] == []  # no reconciler configured: no alarm
    finally:
        unconfigured.runtime.stop()


def test_what_boxes_send_is_escaped(viewer: FlaskClient, world: World) -> None:
    """A box that has the fleet key chooses its claimed name: it must not become markup."""
    from tests.server.conftest import box_headers

    hostile = '<img src=x onerror="alert(1)">'
    plane = world.app.test_client()
    assert plane.get("/vllm/config", headers=box_headers(hostile)).status_code == 404
    assert hostile in [b["box"] for b in viewer.get("/api/attention").get_json()["unknown_boxes"]]
    html = viewer.get("/").get_data(as_text=True)
    assert hostile not in html
    assert "&lt;img src=x onerror=&#34;alert(1)&#34;&gt;" in html


def box_names(fleet: dict[str, Any]) -> list[str]:
    return [b["name"] for b in fleet["boxes"]]


def test_the_fleet_filter_keeps_the_boxes_needing_attention_or_matching_a_search(viewer: FlaskClient) -> None:
    everything = viewer.get("/api/fleet").get_json()
    assert (everything["show"], everything["q"], everything["total_boxes"]) == ("all", "", 4)
    assert box_names(everything) == sorted([HEALTHY_BOX, STALLED_BOX, FOREIGN_BOX, PENDING_BOX])
    problems = viewer.get("/api/fleet?show=problems").get_json()  # Stale, Stalled, Foreign, Pending: all of them
    assert box_names(problems) == box_names(everything)
    assert (problems["total_boxes"], problems["verdicts"]) == (4, everything["verdicts"])  # counts: whole fleet
    assert box_names(viewer.get("/api/fleet?q=SLOW-C").get_json()) == [STALLED_BOX]  # a model, any case
    assert box_names(viewer.get("/api/fleet?q=%20127.0.0.2%20").get_json()) == [HEALTHY_BOX]  # a box name, trimmed
    assert box_names(viewer.get("/api/fleet?show=problems&q=tiny-b").get_json()) == [HEALTHY_BOX, PENDING_BOX]

    page = text_of(viewer.get("/?show=problems&q=tiny").get_data(as_text=True))
    assert "Showing 3 of 4 boxes · show every box" in page
    assert STALLED_BOX not in page.split("Showing", 1)[1] and FOREIGN_BOX in page  # slow-c only
    assert "No box matches the filter." in viewer.get("/?q=nothing-like-this").get_data(as_text=True)
    assert "Showing" not in text_of(viewer.get("/").get_data(as_text=True))


def test_a_bad_fleet_filter_is_a_400_that_says_why(viewer: FlaskClient) -> None:
    for url in ("/api/fleet?show=bogus", "/?show=bogus"):
        reply = viewer.get(url)
        assert reply.status_code == 400
        assert reply.get_json()["error"] == "show must be one of all, problems, not 'bogus'"
    reply = viewer.get("/api/fleet?q=" + "x" * 201)
    assert (reply.status_code, reply.get_json()["error"]) == (400, "q is longer than 200 characters")


def test_what_needs_attention(world: World) -> None:
    view = fleet_view(gather(world.runtime, boxes=True))
    box = next(b for b in view.boxes if b.name == HEALTHY_BOX)
    healthy = dataclasses.replace(box, servers=tuple(dataclasses.replace(s, verdict="Healthy") for s in box.servers))
    assert needs_attention(box) and not needs_attention(healthy)  # its second server is Stale
    stopped = healthy.servers[1]
    assert not needs_attention(dataclasses.replace(
        healthy, servers=(healthy.servers[0], dataclasses.replace(stopped, verdict="Down", paused=True))))
    assert needs_attention(dataclasses.replace(healthy, servers=(dataclasses.replace(stopped, verdict=None),)))
    assert needs_attention(dataclasses.replace(healthy, fit=Fit("failed", "does not fit")))
    assert needs_attention(dataclasses.replace(healthy, fit=Fit("install-failed", "install failed")))
    assert needs_attention(dataclasses.replace(healthy, boot_config="stale"))
    assert needs_attention(dataclasses.replace(healthy, render_error="no legacy key"))
    assert not FleetFilter("problems").keeps(healthy) and FleetFilter("all").keeps(healthy)
    assert FleetFilter("all", "TINY-A").keeps(healthy) and not FleetFilter("all", "slow").keeps(healthy)


def test_the_fleet_and_models_pages_show_what_the_last_pass_priced(viewer: FlaskClient, world: World) -> None:
    """A pass whose listings priced a box: its $/h on the box, the model's share, the fleet's sum, and the
    rented box it could not price named (static boxes here: the record is written as a priced pass would)."""
    from fleetllm.adapters.state import open_reconcile_state
    from fleetllm.adapters.state.passes import CostRecord

    last = world.outcomes[-1].record
    model = last.servers[0].model
    cost = CostRecord(2.49, {HEALTHY_BOX: 2.49}, {model: 2.49}, ("pod-gone",),
                      {HEALTHY_BOX: "1 × H100 80GB on RunPod"})
    store = open_reconcile_state(str(world.state))
    try:
        store.record_pass(dataclasses.replace(last, started_at=last.started_at + 1, cost=cost))
    finally:
        store.close()
    fleet = viewer.get("/api/fleet").get_json()
    assert (fleet["cost_per_hour"], fleet["unpriced"]) == (2.49, ["pod-gone"])
    boxes = {b["name"]: b for b in fleet["boxes"]}
    assert (boxes[HEALTHY_BOX]["cost_per_hour"], boxes[HEALTHY_BOX]["rented"]) == (2.49, "1 × H100 80GB on RunPod")
    assert boxes[PENDING_BOX]["cost_per_hour"] is None
    text = text_of(viewer.get("/").get_data(as_text=True))
    assert "Cost: $2.49/h for the rented boxes" in text and "no price read for pod-gone (not counted)" in text
    assert "$2.49/h · 1 × H100 80GB on RunPod" in text
    models = {m["name"]: m for m in viewer.get("/api/models").get_json()["models"]}
    assert models[model]["cost_per_hour"] == 2.49
    assert all(m["cost_per_hour"] is None for name, m in models.items() if name != model)
    assert "The fleet costs $2.49/h" in text_of(viewer.get("/models").get_data(as_text=True))
