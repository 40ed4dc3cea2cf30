"""Golden cases for the planner: what it does, in what order, and what it refuses to do."""

from __future__ import annotations

import dataclasses
import json

from fleetllm.core.fleet.bearer import Salt
from fleetllm.core.fleet.model import Provider
from fleetllm.core.judge.intended import Endpoint, deployment_id
from fleetllm.core.judge.observed import BoxFacts, ProbeStatus, ProviderBox, ProviderListing
from fleetllm.core.judge.plan import ActionKind, PendingDelete, Plan, delete_budget, make_plan
from fleetllm.core.judge.plantext import render_json, render_text

from .builders import (
    NOW,
    SETTINGS,
    assessed,
    deployment_for,
    failed,
    intended,
    observation,
    ok,
    server,
    unmanaged,
    up_history,
)

A1, A2, B1 = server("127.0.0.2", 8001, "qwen"), server("127.0.0.2", 8002, "llama"), server("127.0.0.3", 8001, "qwen")
FETCHED = {"127.0.0.2": BoxFacts(NOW - 60), "127.0.0.3": BoxFacts(NOW - 60)}


def plan_of(servers, probes, deployments, **kw) -> Plan:  # type: ignore[no-untyped-def]
    histories = kw.pop("histories", None)
    settings = kw.pop("settings", SETTINGS)
    pending = kw.pop("pending", None)
    want = intended(servers, settings)
    obs = observation(want, probes, deployments, facts=kw.pop("facts", FETCHED), **kw)
    return make_plan(want, obs, assessed(want, obs, histories), pending)


def kinds(plan: Plan) -> list[tuple[str, str]]:
    return [(str(a.kind), a.id) for a in plan.actions]


def test_healthy_server_without_deployment_is_created() -> None:
    plan = plan_of([A1], {A1.key: ok(A1)}, [])
    assert kinds(plan) == [("create", "fleetllm:127.0.0.2:8001")]
    spec = plan.actions[0].after
    assert spec is not None
    body = spec.body()
    assert body["model_name"] == "qwen"
    assert body["litellm_params"]["api_base"] == "http://127.0.0.2:8001/v1"  # type: ignore[index]
    assert body["litellm_params"]["api_key"] == A1.bearer  # type: ignore[index]
    info = body["model_info"]
    assert info["id"] == "fleetllm:127.0.0.2:8001"
    assert info["managed_by"] == "fleetllm"
    assert info["fleetllm_bearer_fingerprint"].startswith("sha256:")  # type: ignore[index]
    assert info["context_window"] == 4096  # type: ignore[index]
    assert "/" not in spec.id


def test_converged_fleet_plans_nothing() -> None:
    plan = plan_of([A1, A2], {A1.key: ok(A1), A2.key: ok(A2)}, [deployment_for(A1), deployment_for(A2)])
    assert plan.empty
    assert plan.summary == (0, 0, 0)
    assert "No changes." in render_text(plan, intended([A1, A2]))


def test_new_revision_alone_changes_nothing() -> None:
    plan = plan_of([A1], {A1.key: ok(A1)}, [deployment_for(A1, revision="b" * 40)])
    assert plan.empty


def test_public_port_remap_is_an_update() -> None:
    vast = dataclasses.replace(A1, provider=Provider.VAST)
    listing = {Provider.VAST: ProviderListing(Provider.VAST, {"127.0.0.2": ProviderBox(
        "127.0.0.2", {8001: Endpoint("127.0.0.2", 41877)})})}
    old = deployment_for(vast, Endpoint("127.0.0.2", 41234))
    plan = plan_of([vast], {vast.key: ok(vast)}, [old], listings=listing)
    assert kinds(plan) == [("update", vast.id)]
    assert "41234/v1 -> http://127.0.0.2:41877/v1" in plan.actions[0].reason


def test_salt_rotation_is_an_update() -> None:
    rotated = server("127.0.0.2", 8001, "qwen", salt=Salt("another-salt-0123456789"))
    plan = plan_of([rotated], {rotated.key: ok(rotated)}, [deployment_for(A1)])
    assert kinds(plan) == [("update", A1.id)]
    assert "bearer changed" in plan.actions[0].reason


def test_removed_param_is_a_replace_and_renamed_model_an_update() -> None:
    with_param = server("127.0.0.2", 8001, "qwen", params={"chat_template_kwargs": {"enable_thinking": False}})
    plan = plan_of([A1], {A1.key: ok(A1)}, [deployment_for(with_param)])
    assert kinds(plan) == [("replace", A1.id)]
    assert plan.summary == (1, 0, 1)
    renamed = server("127.0.0.2", 8001, "qwen2")
    plan = plan_of([renamed], {renamed.key: ok(renamed)}, [deployment_for(A1)])
    assert kinds(plan) == [("update", A1.id)]
    assert "model_name qwen -> qwen2" in plan.actions[0].reason


def test_not_serving_servers_lose_their_deployment() -> None:
    plan = plan_of([A1, A2, B1], {A1.key: failed(), A2.key: failed(ProbeStatus.UNAUTHORIZED), B1.key: ok(B1)},
                   [deployment_for(A1), deployment_for(A2), deployment_for(B1)],
                   histories={A1.key: dataclasses.replace(up_history(), fail_streak=2, recent="11100")},
                   settings=dataclasses.replace(SETTINGS, max_delete_fraction=1.0))
    assert kinds(plan) == [("delete", A1.id), ("delete", A2.id)]
    assert plan.actions[0].reason.startswith("Down:")
    assert plan.actions[1].reason.startswith("Foreign:")


def test_one_failed_probe_keeps_the_deployment() -> None:
    plan = plan_of([A1], {A1.key: failed()}, [deployment_for(A1)], histories={A1.key: up_history()})
    assert plan.empty
    assert plan.judgements[A1.key].verdict == "Healthy"


def test_healthy_only_by_hysteresis_is_not_routed_again() -> None:
    """A server released from a rollout's hold (its deployment drained) that crash-loops: Healthy by
    hysteresis (one failed probe of three), but its probe failed this pass, so no deployment is created
    (issue 27: LiteLLM routed to a closed port for seconds). A good probe creates it."""
    history = {A1.key: dataclasses.replace(up_history(), fail_streak=1, recent="11110")}
    for status in (ProbeStatus.REFUSED, ProbeStatus.TIMEOUT, ProbeStatus.UNHEALTHY, ProbeStatus.ERROR):
        plan = plan_of([A1], {A1.key: failed(status)}, [], histories=history)
        assert plan.judgements[A1.key].verdict in ("Healthy", "Unknown"), status
        assert plan.empty, status
        if status is not ProbeStatus.ERROR:  # our own failure: Unknown, which keeps and creates nothing
            assert "no probe succeeded this pass" in plan.unrouted[A1.key]
    plan = plan_of([A1], {A1.key: ok(A1)}, [], histories=history)
    assert kinds(plan) == [("create", A1.id)]


def test_unknown_keeps_what_exists_and_creates_nothing() -> None:
    plan = plan_of([A1, A2], {A1.key: failed(ProbeStatus.ERROR), A2.key: failed(ProbeStatus.ERROR)},
                   [deployment_for(A1)])
    assert plan.empty


def test_move_creates_before_it_deletes() -> None:
    plan = plan_of([B1], {B1.key: ok(B1)}, [deployment_for(A1)])
    assert kinds(plan) == [("create", B1.id), ("delete", A1.id)]
    assert "removed from the repository" in plan.actions[1].reason
    text = render_text(plan, intended([B1]))
    assert text.index("+ deployment") < text.index("- deployment")
    assert text.rstrip().endswith("Plan: 1 to add, 0 to change, 1 to destroy.")


def test_removed_server_still_serving_is_kept_until_its_replacement_serves() -> None:
    plan = plan_of([B1], {B1.key: failed()}, [deployment_for(A1)], orphan_probes={A1.id: ok(A1)})
    assert plan.empty
    assert plan.held[0].id == A1.id
    assert "kept while it still serves" in plan.held[0].reason
    plan = plan_of([B1], {B1.key: failed()}, [deployment_for(A1)], orphan_probes={A1.id: failed()})
    assert kinds(plan) == [("delete", A1.id)]


def test_unmanaged_deployments_are_drift_and_never_touched() -> None:
    squatter = unmanaged(A1.id, "qwen", "http://127.0.0.2:8001/v1")
    plan = plan_of([A1, B1], {A1.key: ok(A1), B1.key: failed()},
                   [squatter, unmanaged("cfg-1"), unmanaged("hand-made", "qwen", "http://127.0.0.3:8001/v1")])
    assert plan.empty
    reasons = {d.id: d.reason for d in plan.drift}
    assert "no managed_by marker" in reasons[A1.id]
    assert "pointing at fleet server 127.0.0.3:8001" in reasons["hand-made"]
    assert "cfg-1" in reasons


def test_failed_listing_holds_every_delete() -> None:
    listings = {Provider.RUNPOD: ProviderListing(Provider.RUNPOD, error="RunPod GET /v2/pods: HTTP 502")}
    plan = plan_of([B1], {B1.key: ok(B1)}, [deployment_for(A1)], listings=listings)
    assert kinds(plan) == [("create", B1.id)]
    assert plan.held[0].kind is ActionKind.DELETE
    assert "observation failed" in plan.blocked[0]


def test_failed_litellm_listing_plans_nothing() -> None:
    plan = plan_of([A1], {A1.key: ok(A1)}, None)
    assert plan.empty
    assert not plan.listed
    assert plan.litellm_error == "LiteLLM GET /v2/model/info: HTTP 503"
    assert plan.errors
    assert plan.blocked == ()  # not a safety valve: there is no plan to hold anything of


def test_unreachable_litellm_says_only_the_truth() -> None:
    # Before: "No changes. LiteLLM has a deployment exactly for the servers that serve." then "Deletes
    # blocked: the LiteLLM listing failed: nothing can be planned", and "qwen available (1/1)".
    text = render_text(plan_of([A1], {A1.key: ok(A1)}, None), intended([A1]))
    assert "No changes" not in text
    assert "available" not in text
    assert "Deletes blocked" not in text
    assert ("No plan: LiteLLM's deployments are not known (LiteLLM GET /v2/model/info: HTTP 503). The verdicts "
            "above are this pass's own") in text
    assert "qwen 1/1 serving" in text
    assert text.rstrip().endswith("Plan: none (LiteLLM's deployments are not known; nothing would be written).")


def test_a_model_is_available_only_through_a_deployment_that_routes_to_it() -> None:
    # The only deployment under A1's id is LiteLLM's own, without the marker: left alone, so nothing routes
    # to A1 and every chat to qwen fails. Before: "qwen available (1/1)" and "No changes".
    foreign = unmanaged(A1.id, "qwen", f"http://{A1.box}:{A1.port}/v1")
    plan = plan_of([A1], {A1.key: ok(A1)}, [foreign])
    assert plan.empty and plan.drift
    text = render_text(plan, intended([A1]))
    assert "qwen unavailable (0/1 routed)" in text
    assert (f"  ! qwen 127.0.0.2:8001: LiteLLM holds {A1.id} without fleetllm's managed_by marker, so fleetllm "
            "neither uses nor replaces it: delete it in LiteLLM and the next apply creates fleetllm's own") in text
    assert "LiteLLM has a deployment exactly for the servers that serve" not in text
    assert "No changes fleetllm can make, but some serving servers have no deployment that routes to them" in text
    doc = json.loads(render_json(plan, intended([A1])))
    assert doc["models"]["qwen"]["routed"] == 0 and doc["models"]["qwen"]["unrouted"]
    assert doc["listed"] is True and doc["litellm_error"] is None


def test_routed_counts_follow_the_deployments() -> None:
    plan = plan_of([A1, B1], {A1.key: ok(A1), B1.key: ok(B1)}, [deployment_for(A1)])
    text = render_text(plan, intended([A1, B1]))
    assert "qwen degraded (1/2 routed)" in text
    assert "  ! qwen 127.0.0.3:8001: no deployment yet: `fleetllm apply` creates it" in text
    done = plan_of([A1, B1], {A1.key: ok(A1), B1.key: ok(B1)}, [deployment_for(A1), deployment_for(B1)])
    text = render_text(done, intended([A1, B1]))
    assert "qwen available (2/2 routed)" in text
    assert "No changes. LiteLLM has a deployment exactly for the servers that serve." in text
    paused = server("127.0.0.3", 8001, "qwen", paused=True)
    held = plan_of([paused], {paused.key: ok(paused)}, [])
    assert "no deployment yet: held, reconcile: paused" in render_text(held, intended([paused]))


def test_a_provider_without_a_key_is_dialled_at_the_listen_port_with_a_warning() -> None:
    vast = server("192.0.2.45", 8001, "qwen", provider=Provider.VAST)
    plan = plan_of([vast], {vast.key: ok(vast)}, [])
    assert [a.after.api_base for a in plan.actions if a.after] == ["http://192.0.2.45:8001/v1"]
    warning = ("vast box(es) 192.0.2.45: no vast key configured (providers.vast): public port assumed = listen "
               "port, as the box contract says; configure the key if the provider maps ports")
    assert plan.warnings == (warning,)
    text = render_text(plan, intended([vast]))
    assert f"Warnings:\n  ! {warning}" in text
    assert plan.judgements[vast.key].reason.endswith("[no vast key configured (providers.vast): public port "
                                                     "assumed = listen port, as the box contract says; configure "
                                                     "the key if the provider maps ports]")
    assert json.loads(render_json(plan, intended([vast])))["warnings"] == [warning]


def test_delete_budget_holds_all_deletes_and_says_why() -> None:
    servers = [server("127.0.0.2", 8000 + i, "m") for i in range(1, 7)]
    deployments = [deployment_for(s) for s in servers]
    plan = plan_of([], {}, deployments)  # every box removed: 6 deletes, budget min(10, 0.5*6) = 3
    assert plan.empty
    assert "6 deletes exceed this pass's limit of 3" in plan.blocked[0]
    assert len(plan.held) == 6
    assert delete_budget(10, 0.34, 1) == 1
    assert delete_budget(0, 1.0, 50) == 0


def test_prune_off_and_paused() -> None:
    plan = plan_of([], {}, [deployment_for(A1)], settings=dataclasses.replace(SETTINGS, prune=False))
    assert plan.empty
    assert "prune is off" in plan.blocked[0]
    paused = dataclasses.replace(A1, paused=True)
    plan = plan_of([paused], {paused.key: ok(paused)}, [])
    assert plan.empty
    assert plan.held[0].reason.startswith("reconcile: paused")


def test_pending_delete_is_marked_as_a_retry() -> None:
    pending = {A1.id: PendingDelete(A1.id, 2, "HTTP 503", NOW - 120)}
    plan = plan_of([], {}, [deployment_for(A1), deployment_for(A2), deployment_for(B1)], pending=pending,
                   settings=dataclasses.replace(SETTINGS, max_delete_fraction=1.0))
    delete = next(a for a in plan.actions if a.id == A1.id)
    assert "retry: 2 failed attempt(s)" in delete.reason


def test_json_plan_has_format_version_and_no_bearer() -> None:
    plan = plan_of([A1, B1], {A1.key: ok(A1), B1.key: failed()}, [deployment_for(server("127.0.0.4", 8001))])
    text = render_json(plan, intended([A1, B1]))
    doc = json.loads(text)
    assert doc["format_version"] == "1.2"
    assert doc["summary"] == {"add": 1, "change": 0, "destroy": 1}
    assert [a["actions"] for a in doc["actions"]] == [["create"], ["delete"]]
    assert "api_key" not in doc["actions"][0]["after"]["litellm_params"]
    assert A1.bearer not in text
    assert B1.bearer not in text
    assert {s["verdict"] for s in doc["servers"]} == {"Healthy", "Loading"}
    assert doc["models"]["qwen"]["availability"] == "degraded"
    assert deployment_id("127.0.0.4", 8001) == doc["actions"][1]["id"]


def test_saved_plan_applies_only_when_the_fleet_plans_the_same(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import pytest

    from fleetllm.job.saved import PlanFileError, SavedPlan, StalePlan

    plan = plan_of([A1, B1], {A1.key: ok(A1), B1.key: ok(B1)}, [])
    path = tmp_path / "plan.json"
    path.write_text(render_json(plan, intended([A1, B1])))
    saved = SavedPlan.load(path)
    saved.check(plan)  # same plan: fine
    with pytest.raises(StalePlan, match="1 planned action"):
        saved.check(plan_of([A1, B1], {A1.key: ok(A1), B1.key: failed()}, []))
    moved = dataclasses.replace(plan, revision="c" * 40)
    with pytest.raises(StalePlan, match="revision"):
        saved.check(moved)
    path.write_text('{"format_version": "2.0"}')
    with pytest.raises(PlanFileError):
        SavedPlan.load(path)
