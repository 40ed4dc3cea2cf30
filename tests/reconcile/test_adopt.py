"""Adopting llmao's deployments (`--adopt llmao`): the pure plan and the make-before-break apply."""

from __future__ import annotations

import asyncio

from fleetllm.core.fleet.jsonvalue import freeze_mapping
from fleetllm.core.fleet.model import Provider, ReconcileSettings
from fleetllm.core.judge.adopt import adopt, normalise_base
from fleetllm.core.judge.adoption import AdoptSource, Fate
from fleetllm.core.judge.intended import Endpoint
from fleetllm.core.judge.observed import BoxFacts, Deployment, ProviderBox, ProviderListing
from fleetllm.core.judge.plan import ActionKind, Plan, make_plan
from fleetllm.core.judge.plantext import render_json, render_text
from fleetllm.job.apply import apply_plan

from .builders import NOW, SETTINGS, assessed, deployment_for, failed, intended, observation, ok, server
from .fake_litellm import FakeLitellm

A1, A2, B1 = server("127.0.0.2", 8001, "qwen"), server("127.0.0.2", 8002, "llama"), server("127.0.0.3", 8001, "qwen")
FETCHED = {"127.0.0.2": BoxFacts(NOW - 60), "127.0.0.3": BoxFacts(NOW - 60)}


def llmao(ident: str, model: str, base: str, *, encrypted: bool = False, self_hosted: bool = True) -> Deployment:
    """A deployment as llmao writes it: LiteLLM's id, no marker, self_hosted and asf_api_base."""
    info = {"id": ident, "self_hosted": self_hosted, "db_model": True}
    if self_hosted:
        info["asf_api_base"] = base
    return Deployment(ident, model, freeze_mapping(info), "gAAAAB-encrypted" if encrypted else base + "/v1")


def adopted(servers, probes, deployments, *, prune=False, settings=SETTINGS, **kw) -> Plan:  # type: ignore[no-untyped-def]
    want = intended(servers, settings)
    obs = observation(want, probes, deployments, facts=FETCHED, **kw)
    assessment = assessed(want, obs, None)
    return adopt(make_plan(want, obs, assessment), want, obs, assessment, AdoptSource.LLMAO, prune_adopted=prune)


def fates(plan: Plan) -> dict[str, Fate]:
    return {a.id: a.fate for a in plan.adoptions}


def test_normalised_address_is_llmaos_identity() -> None:
    assert normalise_base("http://203.0.113.10:41234/v1/") == "http://203.0.113.10:41234"
    assert normalise_base(" HTTP://[::ffff:203.0.113.10]:8001/v1") == "http://203.0.113.10:8001"
    assert normalise_base("http://h:1/v1/v1") == "http://h:1/v1"  # one /v1 only, as llmao strips it
    assert normalise_base("gAAAAB-encrypted") is None and normalise_base(None) is None


def test_serving_server_gets_ours_first_then_llmaos_is_deleted() -> None:
    old = llmao("5f0c-uuid", "qwen", "http://127.0.0.2:8001")
    plan = adopted([A1], {A1.key: ok(A1)}, [old])
    assert [(a.kind, a.id) for a in plan.actions] == [(ActionKind.CREATE, A1.id), (ActionKind.DELETE, old.id)]
    delete = plan.actions[1]
    assert delete.adopted and delete.requires == A1.id
    assert fates(plan) == {old.id: Fate.REPLACED}
    assert not plan.drift  # shown as an adoption, not as drift
    text = render_text(plan, intended([A1]))
    assert "Adoption of llmao's deployments" in text and "replaced" in text
    assert text.index(f"+ deployment {A1.id}") < text.index(f"- deployment {old.id}")
    assert '"fate": "replaced"' in render_json(plan, intended([A1]))


def test_matched_by_asf_api_base_when_api_base_reads_back_encrypted() -> None:
    old = llmao("uuid-enc", "qwen", "http://127.0.0.2:8001", encrypted=True)
    assert fates(adopted([A1], {A1.key: ok(A1)}, [old])) == {old.id: Fate.REPLACED}


def test_model_name_must_match_too() -> None:
    old = llmao("uuid-other-model", "llama", "http://127.0.0.2:8001")
    plan = adopted([A1], {A1.key: ok(A1)}, [old])
    assert fates(plan) == {old.id: Fate.NOT_INTENDED}
    assert [a.id for a in plan.actions] == [A1.id]


def test_ours_already_there_still_replaces() -> None:
    old = llmao("uuid-1", "qwen", "http://127.0.0.2:8001")
    plan = adopted([A1], {A1.key: ok(A1)}, [deployment_for(A1), old])
    assert [(a.kind, a.id) for a in plan.actions] == [(ActionKind.DELETE, old.id)]
    assert "already in LiteLLM" in plan.actions[0].reason


def test_a_server_that_does_not_serve_keeps_llmaos_deployment() -> None:
    old = llmao("uuid-1", "qwen", "http://127.0.0.2:8001")
    plan = adopted([A1], {A1.key: failed()}, [old])
    assert not plan.actions
    assert fates(plan) == {old.id: Fate.WAITING}


def test_not_intended_is_left_unless_prune_adopted_and_commercial_is_never_touched() -> None:
    gone = llmao("uuid-gone", "qwen", "http://198.51.100.9:8001")
    commercial = llmao("uuid-gpt", "gpt-4o", "https://api.openai.com", self_hosted=False)
    plan = adopted([A1], {A1.key: ok(A1)}, [gone, commercial])
    assert fates(plan) == {gone.id: Fate.NOT_INTENDED, commercial.id: Fate.COMMERCIAL}
    assert [a.id for a in plan.actions] == [A1.id]
    pruned = adopted([A1], {A1.key: ok(A1)}, [gone, commercial], prune=True)
    assert fates(pruned) == {gone.id: Fate.PRUNED, commercial.id: Fate.COMMERCIAL}
    assert [(a.kind, a.id, a.requires) for a in pruned.actions] == [(ActionKind.CREATE, A1.id, None),
                                                                    (ActionKind.DELETE, gone.id, None)]


def test_prune_adopted_respects_the_delete_budget() -> None:
    gone = [llmao(f"uuid-gone-{i}", "qwen", f"http://198.51.100.9:{9000 + i}") for i in range(4)]
    settings = ReconcileSettings(max_deletes_per_pass=2, max_delete_fraction=1.0)
    plan = adopted([A1], {A1.key: ok(A1)}, gone, prune=True, settings=settings)
    assert [a.id for a in plan.actions] == [A1.id]
    assert plan.blocked and "exceed" in plan.blocked[0]
    assert set(fates(plan).values()) == {Fate.HELD}


def test_replacements_are_not_capacity_deletes_so_the_budget_does_not_hold_them() -> None:
    olds = [llmao("uuid-a1", "qwen", "http://127.0.0.2:8001"), llmao("uuid-a2", "llama", "http://127.0.0.2:8002"),
            llmao("uuid-b1", "qwen", "http://127.0.0.3:8001")]
    settings = ReconcileSettings(max_deletes_per_pass=1, max_delete_fraction=0.1)
    plan = adopted([A1, A2, B1], {s.key: ok(s) for s in (A1, A2, B1)}, olds, settings=settings)
    assert plan.count(ActionKind.CREATE) == 3 and plan.count(ActionKind.DELETE) == 3
    assert not plan.blocked


def test_an_observation_failure_holds_every_adoption_delete() -> None:
    v1 = server("203.0.113.10", 8001, "qwen", provider=Provider.VAST)
    old = llmao("uuid-1", "qwen", "http://127.0.0.2:8001")
    listing = {Provider.VAST: ProviderListing(Provider.VAST, error="HTTP 503")}
    plan = adopted([A1, v1], {A1.key: ok(A1)}, [old], listings=listing)
    assert [a.kind for a in plan.actions] == [ActionKind.CREATE]
    assert fates(plan) == {old.id: Fate.HELD}


def test_paused_servers_keep_llmaos_deployment() -> None:
    paused = server("127.0.0.2", 8001, "qwen", paused=True)
    old = llmao("uuid-1", "qwen", "http://127.0.0.2:8001")
    plan = adopted([paused], {paused.key: ok(paused)}, [old])
    assert not plan.actions and fates(plan) == {old.id: Fate.HELD}


def test_a_vast_server_matches_on_its_public_port() -> None:
    v1 = server("203.0.113.10", 8001, "qwen", provider=Provider.VAST)
    listing = {Provider.VAST: ProviderListing(Provider.VAST, {"203.0.113.10": ProviderBox(
        "203.0.113.10", {8001: Endpoint("203.0.113.10", 41234)})})}
    old = llmao("uuid-v", "qwen", "http://203.0.113.10:41234")
    wrong_port = llmao("uuid-w", "qwen", "http://203.0.113.10:8001")
    plan = adopted([v1], {v1.key: ok(v1)}, [old, wrong_port], listings=listing)
    assert fates(plan) == {old.id: Fate.REPLACED, wrong_port.id: Fate.NOT_INTENDED}


def test_apply_deletes_llmaos_only_after_ours_is_in_litellm() -> None:
    old = llmao("uuid-1", "qwen", "http://127.0.0.2:8001")
    plan = adopted([A1], {A1.key: ok(A1)}, [old])
    api = FakeLitellm(rows={old.id: old})
    results = asyncio.run(apply_plan(plan, api))
    assert [(r.action.id, r.ok, r.outcome) for r in results] == [(A1.id, True, "created"), (old.id, True, "deleted")]
    assert set(api.rows) == {A1.id} and api.writes == [("create", A1.id), ("delete", old.id)]


def test_apply_keeps_llmaos_when_our_create_failed() -> None:
    old = llmao("uuid-1", "qwen", "http://127.0.0.2:8001")
    plan = adopted([A1], {A1.key: ok(A1)}, [old])

    api = FakeLitellm(rows={old.id: old})

    async def failing_create(spec):  # type: ignore[no-untyped-def]
        from fleetllm.adapters.litellm import LitellmError
        raise LitellmError("LiteLLM create: HTTP 500")

    api.create = failing_create  # type: ignore[method-assign]
    results = asyncio.run(apply_plan(plan, api))
    outcome = {r.action.id: (r.ok, r.outcome) for r in results}
    assert outcome == {A1.id: (False, "failed"), old.id: (False, "refused")}
    assert set(api.rows) == {old.id}  # no gap: llmao's route is still there
    assert "make-before-break" in next(r.error or "" for r in results if r.action.id == old.id)


def test_apply_never_deletes_a_row_that_became_ours() -> None:
    old = llmao("uuid-1", "qwen", "http://127.0.0.2:8001")
    plan = adopted([A1], {A1.key: ok(A1)}, [old])
    marked = Deployment(old.id, old.model_name, freeze_mapping({"id": old.id, "managed_by": "fleetllm"}))
    api = FakeLitellm(rows={old.id: marked})
    results = asyncio.run(apply_plan(plan, api))
    assert old.id in api.rows and any(r.outcome == "refused" for r in results)


def test_a_saved_adoption_plan_applies_only_as_an_adoption(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import pytest

    from fleetllm.job.saved import SavedPlan, StalePlan

    old = llmao("uuid-1", "qwen", "http://127.0.0.2:8001")
    plan = adopted([A1], {A1.key: ok(A1)}, [old])
    path = tmp_path / "plan.json"
    path.write_text(render_json(plan, intended([A1])))
    saved = SavedPlan.load(path)
    assert saved.adopt_source == "llmao"
    saved.check(plan)
    want = intended([A1])
    obs = observation(want, {A1.key: ok(A1)}, [old], facts=FETCHED)
    without = make_plan(want, obs, assessed(want, obs, None))
    with pytest.raises(StalePlan):
        saved.check(without)


def test_without_adopt_llmaos_deployments_are_drift_that_names_the_way_out() -> None:
    old = llmao("uuid-1", "qwen", "http://127.0.0.2:8001")
    want = intended([A1])
    obs = observation(want, {A1.key: ok(A1)}, [old], facts=FETCHED)
    plan = make_plan(want, obs, assessed(want, obs, None))
    assert [a.id for a in plan.actions] == [A1.id]  # nothing of llmao's is touched without --adopt
    assert [d.id for d in plan.drift] == [old.id] and "--adopt llmao" in plan.drift[0].reason
