"""Whole actions, held entries and drift compared exactly, and the planner's texts: mutation testing
(docs/testing.md) showed the other plan tests let a wrong model name, a dropped `before`/`after`, a
changed reason or a broken orphan/drift classification through."""

from __future__ import annotations

import dataclasses

from fleetllm.core.fleet.bearer import Salt
from fleetllm.core.fleet.jsonvalue import freeze_mapping
from fleetllm.core.fleet.model import Provider
from fleetllm.core.judge.intended import Endpoint, desired_deployment
from fleetllm.core.judge.observed import BoxFacts, Deployment, ProviderBox, ProviderListing
from fleetllm.core.judge.plan import Action, ActionKind, Drift, Held, PendingDelete, make_plan, update_changes

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
from .test_plan import A1, A2, B1, plan_of

REV = "a" * 40


def test_a_create_is_exact() -> None:
    plan = plan_of([A1], {A1.key: ok(A1)}, [])
    spec = desired_deployment(A1, Endpoint("127.0.0.2", 8001), REV)
    assert plan.actions == (Action(ActionKind.CREATE, A1.id, "qwen", f"Healthy: {plan.judgements[A1.key].reason}",
                                   after=spec),)


def test_a_replace_is_exact() -> None:
    with_param = server("127.0.0.2", 8001, "qwen", params={"temperature": 0.1, "top_p": 0.9},
                        salt=Salt("another-salt-0123456789"))
    before = deployment_for(with_param)
    plan = plan_of([A1], {A1.key: ok(A1)}, [before])
    spec = desired_deployment(A1, Endpoint("127.0.0.2", 8001), REV)
    changes = ("bearer changed (salt rotated or legacy key changed)", "litellm_params removed: temperature, top_p")
    assert plan.actions == (Action(ActionKind.REPLACE, A1.id, "qwen", "; ".join(changes), after=spec, before=before,
                                   changes=changes),)
    assert update_changes(before, spec, REV) == (list(changes), True)


def test_an_update_without_a_visible_change_names_the_revision() -> None:
    spec = desired_deployment(A1, Endpoint("127.0.0.2", 8001), "0123456789abcdef" * 2 + "01234567")
    same = deployment_for(A1)
    changed = dataclasses.replace(same, model_info=freeze_mapping({**same.model_info, "fleetllm_spec": "other"}))
    assert update_changes(changed, spec, "0123456789abcdef0123") == (
        ["route fields changed in the repository (revision 0123456789ab)"], False)


def test_a_paused_create_is_held_exactly() -> None:
    paused = dataclasses.replace(A1, paused=True)
    plan = plan_of([paused], {paused.key: ok(paused)}, [])
    assert plan.actions == ()
    assert plan.held == (Held(ActionKind.CREATE, A1.id, "qwen", "reconcile: paused (box or model)"),)
    assert dict(plan.unrouted) == {A1.key: "no deployment yet: held, reconcile: paused"}


def test_a_not_serving_delete_is_exact() -> None:
    before = deployment_for(A2)
    plan = plan_of([A1, A2], {A1.key: ok(A1), A2.key: failed()}, [deployment_for(A1), before],
                   histories={A2.key: dataclasses.replace(
                       up_history(),
                       fail_streak=2, recent="11100")},
                   settings=dataclasses.replace(SETTINGS, max_delete_fraction=1.0))
    assert plan.actions == (Action(ActionKind.DELETE, A2.id, "llama", f"Down: {plan.judgements[A2.key].reason}",
                                   before=before),)


def test_orphan_reasons() -> None:
    gone_box = deployment_for(server("127.0.0.9", 8001, "qwen"))
    gone_server = deployment_for(server("127.0.0.2", 8003, "qwen"))
    odd = Deployment("fleetllm-odd", "qwen", freeze_mapping({"id": "fleetllm-odd", "managed_by": "fleetllm"}))
    plan = plan_of([A1], {A1.key: ok(A1)}, [deployment_for(A1), gone_box, gone_server, odd],
                   settings=dataclasses.replace(SETTINGS, max_delete_fraction=1.0))
    assert plan.actions == (  # sorted by id: "-" before ":"
        Action(ActionKind.DELETE, "fleetllm-odd", "qwen", "managed by fleetllm but not a deployment id fleetllm makes",
               before=odd),
        Action(ActionKind.DELETE, gone_server.id, "qwen", "server 127.0.0.2:8003 was removed from the repository",
               before=gone_server),
        Action(ActionKind.DELETE, gone_box.id, "qwen", "box 127.0.0.9 was removed from the repository",
               before=gone_box),
    )


def test_an_orphan_is_held_only_while_no_other_server_of_its_model_serves() -> None:
    old = deployment_for(A1)
    held = plan_of([B1], {B1.key: failed()}, [old], orphan_probes={A1.id: ok(A1)})
    assert held.held == (Held(ActionKind.DELETE, A1.id, "qwen", "box 127.0.0.2 was removed from the repository; "
                                                                 "kept while it still serves and no other server of "
                                                                 "qwen does yet"),)
    # B1 serves: the old one goes although it still answers.
    plan = plan_of([B1], {B1.key: ok(B1)}, [old], orphan_probes={A1.id: ok(A1)})
    assert [a.kind for a in plan.actions] == [ActionKind.CREATE, ActionKind.DELETE]
    # B1 Stalled (not on its way): nothing to wait for.
    wanted = intended([B1])
    obs = observation(wanted, {B1.key: failed()}, [old], facts={B1.box: BoxFacts(fetched_at=NOW - 10_000)},
        orphan_probes={A1.id: ok(A1)})
    stalled = make_plan(wanted, obs, assessed(wanted, obs))
    assert stalled.judgements[B1.key].verdict == "Stalled"
    assert [a.kind for a in stalled.actions] == [ActionKind.DELETE]


def test_drift_is_exact() -> None:
    squatter = unmanaged(A1.id, "qwen", "http://127.0.0.2:8001/v1")
    pointing = unmanaged("hand-made", "qwen", "http://127.0.0.3:8001/v1/")
    config_file = dataclasses.replace(unmanaged("cfg-1", "other"), db_model=False)
    plan = plan_of([A1, B1], {A1.key: ok(A1), B1.key: ok(B1)}, [squatter, pointing, config_file, deployment_for(B1)])
    assert plan.drift == (
        Drift(A1.id, "qwen", "has fleetllm's id for 127.0.0.2:8001 but no managed_by marker: not touched"),
        Drift("cfg-1", "other", "config-file model (in LiteLLM, not in the repository): never touched"),
        Drift("hand-made", "qwen", "unmanaged deployment pointing at fleet server 127.0.0.3:8001 (in LiteLLM, not in "
                                   "the repository)"),
    )


def test_valves_hold_each_delete_exactly() -> None:
    before = deployment_for(A1)
    listings = {Provider.VAST: ProviderListing(Provider.VAST, error="HTTP 502")}
    vast = server("127.0.0.5", 8001, "v", provider=Provider.VAST)
    plan = plan_of([vast], {}, [before], listings=listings)
    why = "no deletes while an observation failed (vast listing: HTTP 502)"
    assert plan.blocked == (why,)
    assert plan.held == (Held(ActionKind.DELETE, A1.id, "qwen",
                              f"box 127.0.0.2 was removed from the repository [held: {why}]"),)
    plan = plan_of([], {}, [before], settings=dataclasses.replace(SETTINGS, prune=False))
    assert plan.blocked == ("prune is off (fleet.yaml reconcile.prune: false)",)


def test_a_retry_keeps_the_action_and_adds_why() -> None:
    before = deployment_for(A1)
    pending = {A1.id: PendingDelete(A1.id, 2, "HTTP 503", NOW - 120)}
    plan = plan_of([A2], {A2.key: ok(A2)}, [before, deployment_for(A2)], pending=pending,
                   settings=dataclasses.replace(SETTINGS, max_delete_fraction=1.0))
    assert plan.actions == (Action(ActionKind.DELETE, A1.id, "qwen", "server 127.0.0.2:8001 was removed from the "
                                   "repository (retry: 2 failed attempt(s), last: HTTP 503)", before=before),)


def test_not_listed_plans_nothing_and_keeps_the_warnings() -> None:
    vast = server("192.0.2.45", 8001, "qwen", provider=Provider.VAST)
    wanted = intended([vast])
    obs = dataclasses.replace(observation(wanted, {vast.key: ok(vast)}, None), litellm_error=None)
    plan = make_plan(wanted, obs, assessed(wanted, obs))
    assert plan.actions == () and plan.held == () and plan.drift == ()
    assert plan.litellm_error == "the LiteLLM listing failed"
    assert len(plan.warnings) == 1


def test_warnings_name_every_box_once() -> None:
    a, b = server("192.0.2.45", 8001, "q", provider=Provider.VAST), server("192.0.2.7", 8001, "q",
                                                                            provider=Provider.VAST)
    c = server("192.0.2.45", 8002, "r", provider=Provider.VAST)
    plan = plan_of([a, b, c], {}, [])
    assert plan.warnings[0].startswith("vast box(es) 192.0.2.45, 192.0.2.7: no vast key configured")


def test_an_unknown_endpoint_is_unrouted_and_says_why() -> None:
    vast = server("127.0.0.5", 8001, "v", provider=Provider.VAST)
    listing = {Provider.VAST: ProviderListing(Provider.VAST, {"127.0.0.5": ProviderBox("127.0.0.5", {})})}
    plan = plan_of([vast], {vast.key: failed()}, [], listings=listing, histories={vast.key: up_history()})
    assert plan.judgements[vast.key].verdict == "Healthy"
    assert dict(plan.unrouted) == {vast.key: "no deployment, and its public endpoint is unknown this pass: none "
                                             "can be made"}
    kept = plan_of([vast], {vast.key: failed()}, [deployment_for(vast)], listings=listing,
                   histories={vast.key: up_history()})
    assert dict(kept.unrouted) == {} and kept.actions == ()


def test_one_server_s_skip_does_not_end_the_loop() -> None:
    # A squatter under A1's id, then B1 serving without a deployment: B1 is still created.
    squatter = unmanaged(A1.id, "qwen", "http://127.0.0.2:8001/v1")
    plan = plan_of([A1, B1], {A1.key: ok(A1), B1.key: ok(B1)}, [squatter])
    assert [(a.kind, a.id) for a in plan.actions] == [(ActionKind.CREATE, B1.id)]
    assert plan.warnings == ()  # static boxes: nothing assumed
    # A1 serving by hysteresis with no endpoint this pass, then B1: still created.
    vast = server("127.0.0.2", 8001, "qwen", provider=Provider.VAST)
    listing = {Provider.VAST: ProviderListing(Provider.VAST, {"127.0.0.2": ProviderBox("127.0.0.2", {})})}
    plan = plan_of([vast, B1], {vast.key: failed(), B1.key: ok(B1)}, [], listings=listing,
                   histories={vast.key: up_history()})
    assert [(a.kind, a.id) for a in plan.actions] == [(ActionKind.CREATE, B1.id)]


def test_one_held_orphan_does_not_end_the_orphan_loop() -> None:
    first, second = deployment_for(A1), deployment_for(A2)
    plan = plan_of([B1], {B1.key: failed()}, [first, second], orphan_probes={A1.id: ok(A1)},
                   settings=dataclasses.replace(SETTINGS, max_delete_fraction=1.0))
    assert [h.id for h in plan.held] == [A1.id]
    assert [(a.kind, a.id) for a in plan.actions] == [(ActionKind.DELETE, A2.id)]


def test_an_odd_id_with_a_recorded_key_is_still_not_ours() -> None:
    odd = Deployment("fleetllm-odd", "qwen", freeze_mapping({
        "id": "fleetllm-odd", "managed_by": "fleetllm", "fleetllm_box": "127.0.0.9", "fleetllm_port": 8001}))
    plan = plan_of([A1], {A1.key: ok(A1)}, [deployment_for(A1), odd],
                   settings=dataclasses.replace(SETTINGS, max_delete_fraction=1.0))
    assert [a.reason for a in plan.actions] == ["managed by fleetllm but not a deployment id fleetllm makes"]


def test_a_spec_only_change_names_the_plan_s_revision() -> None:
    same = deployment_for(A1)
    changed = dataclasses.replace(same, model_info=freeze_mapping({**same.model_info, "fleetllm_spec": "other"}))
    plan = plan_of([A1], {A1.key: ok(A1)}, [changed])
    assert plan.actions[0].changes == (f"route fields changed in the repository (revision {REV[:12]})",)


def test_every_failed_observation_is_named_in_the_valve() -> None:
    listings = {Provider.VAST: ProviderListing(Provider.VAST, error="HTTP 502"),
                Provider.RUNPOD: ProviderListing(Provider.RUNPOD, error="HTTP 503")}
    boxes = [server("127.0.0.5", 8001, "v", provider=Provider.VAST),
             server("127.0.0.6", 8001, "r", provider=Provider.RUNPOD)]
    plan = plan_of(boxes, {}, [deployment_for(A1)], listings=listings)
    assert plan.blocked == ("no deletes while an observation failed (runpod listing: HTTP 503; vast listing: "
                            "HTTP 502)",)
