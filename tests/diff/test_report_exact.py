"""The diff report's parts, exactly: the JSON each box, recipe and settings block is compared as, the
lifetime of each field, every alert's whole message at its limits, and the summary line's every
phrase in the singular and the plural. Mutation testing (docs/testing.md) showed these read but
unasserted by the scenario tests (test_report.py) and the golden reports."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from fleetllm.core.diff.compute import _prune_alerts, box_json, recipe_json, settings_json
from fleetllm.core.diff.fields import same, show
from fleetllm.core.diff.report import (
    ABSENT,
    Alert,
    BoxStatus,
    DeploymentAction,
    DeploymentChange,
    FieldChange,
    Level,
    Lifetime,
    RecipeChange,
    Route,
)
from fleetllm.core.diff.summary import summary_line
from fleetllm.core.fleet.jsonvalue import JSON, freeze_mapping
from fleetllm.core.fleet.model import (
    Box,
    FleetSettings,
    LitellmRoute,
    Provider,
    Recipe,
    ReconcileMode,
    ReconcileSettings,
    RolloutMode,
    RolloutSettings,
    ServerRow,
    VllmRecipe,
)
from tests.diff.test_report import TWO_BOXES, codes, diff
from tests.fleet.helpers import FLEET, MODELS, PLACEMENT

ONE_BOX = "hosts:\n  203.0.113.10:\n    - [m1, 8001]\n"


def test_box_json_names_every_detail_and_leaves_out_the_unset() -> None:
    box = Box("b", (ServerRow("m1", 8001, "m1"),), provider=Provider.VAST, gpu_memory_gb=48.0, gpus=2,
              disk_gb=100.0, notes="rack 4", reconcile=ReconcileMode.PAUSED, gateway_port=8001,
              rollout=RolloutMode.MANUAL)
    assert box_json(box) == {"provider": "vast", "gpu_memory_gb": 48.0, "gpus": 2, "disk_gb": 100.0,
                             "notes": "rack 4", "reconcile": "paused", "gateway": 8001, "rollout": "manual"}
    assert box_json(Box("b", ())) == {"reconcile": "active"}


def test_recipe_json_names_every_field_and_leaves_out_the_unset() -> None:
    recipe = Recipe("m", VllmRecipe(model="org/m", served_model_name="chat", args=("--dtype", "half"),
                                    settings=freeze_mapping({"max-num-seqs": 8}), max_model_len=8192,
                                    gpu_memory_utilization=0.5, vram_gb=16.0, disk_gb=30.0, kv_bytes_per_token=1024),
                    LitellmRoute(params=freeze_mapping({"rpm": 10}), model_info=freeze_mapping({"tier": "gold"})),
                    reconcile=ReconcileMode.PAUSED, health_grace_s=600, description="a chat model", max_unavailable=2)
    assert recipe_json(recipe) == {
        "vllm": {"model": "org/m", "served_model_name": "chat", "args": ["--dtype", "half"],
                 "settings": {"max-num-seqs": 8}, "max_model_len": 8192, "gpu_memory_utilization": 0.5,
                 "vram_gb": 16.0, "disk_gb": 30.0, "kv_bytes_per_token": 1024},
        "reconcile": "paused", "litellm": {"params": {"rpm": 10}, "model_info": {"tier": "gold"}},
        "health_grace_s": 600, "max_unavailable": 2, "description": "a chat model"}
    assert recipe_json(Recipe("m", VllmRecipe(model="org/m", served_model_name="m"))) == {
        "vllm": {"model": "org/m", "served_model_name": "m", "args": [], "settings": {}},
        "reconcile": "active", "litellm": {"params": {}, "model_info": {}}}


def test_settings_json_names_every_setting() -> None:
    settings = FleetSettings(listen_ports=(8001, 8002), max_servers_per_box=2, allow_empty_placement=True,
                             legacy_servers=frozenset({("b", 8000), ("a", 8001)}),
                             reconcile=ReconcileSettings(interval_s=30, prune=False),
                             rollout=RolloutSettings(mode=RolloutMode.MANUAL, max_unavailable=2), fleet_id="blue")
    defaults = RolloutSettings()
    found = settings_json(settings)
    assert found["reconcile"] == {**ReconcileSettings().__dict__, "interval_s": 30, "prune": False}
    assert found == {"fleet_id": "blue", "listen_ports": [8001, 8002], "max_servers_per_box": 2, "allow_empty_placement": True,
                     "legacy_servers": ["a:8001", "b:8000"], "reconcile": found["reconcile"],
                     "rollout": {"mode": "manual", "max_unavailable": 2, "poll_s": defaults.poll_s,
                                 "drain_s": defaults.drain_s, "retire_s": defaults.retire_s}}


def test_the_lifetime_of_each_box_detail() -> None:
    before = "hosts:\n  203.0.113.10:\n    servers:\n      - [m1, 8001]\n"
    after = ("hosts:\n  203.0.113.10:\n    provider: vast\n    gpu_memory_gb: 48\n    gpus: 1\n    disk_gb: 100\n"
             "    notes: n\n    reconcile: paused\n    rollout: manual\n    servers:\n      - [m1, 8001]\n")
    (box,) = diff({"placement": before}, {"placement": after}).boxes
    assert (box.status, box.paused) == (BoxStatus.CHANGED, True)
    assert box.details == (
        FieldChange(("disk_gb",), ABSENT, 100.0, Lifetime.NONE),
        FieldChange(("gpu_memory_gb",), ABSENT, 48.0, Lifetime.NONE),
        FieldChange(("gpus",), ABSENT, 1, Lifetime.NONE),
        FieldChange(("notes",), ABSENT, "n", Lifetime.NONE),
        FieldChange(("provider",), ABSENT, "vast", Lifetime.NONE),
        FieldChange(("reconcile",), "active", "paused", Lifetime.LIVE),
        FieldChange(("rollout",), ABSENT, "manual", Lifetime.LIVE))


def test_the_lifetime_of_each_recipe_field() -> None:
    models = MODELS.replace("  m2:\n", "  m2:\n    description: old\n")
    head = models.replace("description: old", "description: new\n    health_grace_s: 600\n    max_unavailable: 2"
                          ).replace("disk_gb: 40}", "disk_gb: 41, max_model_len: 2048}") + \
        "    litellm: {model_info: {tier: gold}}\n"
    report = diff({"models": models}, {"models": head})
    assert report.recipes == (RecipeChange("m2", "change", (
        FieldChange(("description",), "old", "new", Lifetime.NONE),
        FieldChange(("health_grace_s",), ABSENT, 600, Lifetime.LIVE),
        FieldChange(("litellm", "model_info", "tier"), ABSENT, "gold", Lifetime.LIVE),
        FieldChange(("max_unavailable",), ABSENT, 2, Lifetime.LIVE),
        FieldChange(("vllm", "disk_gb"), 40.0, 41.0, Lifetime.BOOT),
        FieldChange(("vllm", "max_model_len"), ABSENT, 2048, Lifetime.BOOT)), 1),)


def test_recipes_added_removed_and_changed_count_their_servers() -> None:
    head = MODELS.replace("  m2:\n    vllm: {model: org/m2, vram_gb: 30, disk_gb: 40}\n", "") + \
        "  m3:\n    vllm: {model: org/m3}\n"
    report = diff({}, {"models": head.replace("org/m1,", "org/m1-v2,"),
                       "placement": "hosts:\n  203.0.113.10:\n    - [m1, 8001]\n    - [m1, 8002, m1-b]\n"
                                    "    - [m3, 8003]\n"})
    assert report.recipes == (
        RecipeChange("m1", "change", (FieldChange(("vllm", "model"), "org/m1", "org/m1-v2", Lifetime.BOOT),), 2),
        RecipeChange("m2", "remove", (), 1),
        RecipeChange("m3", "add", (), 1))


def test_the_lifetime_of_each_setting() -> None:
    base = FLEET + "legacy_servers:\n  - {host: 203.0.113.10, port: 8000}\n"
    head = FLEET.replace("8003]", "8003, 8004]") + "max_servers_per_box: 2\nreconcile: {interval_s: 30}\n" \
        "rollout: {poll_s: 60}\n"
    report = diff({"fleet": base}, {"fleet": head})
    assert report.settings == (
        FieldChange(("legacy_servers",), ["203.0.113.10:8000"], [], Lifetime.BOOT),
        FieldChange(("listen_ports",), [8001, 8002, 8003], [8001, 8002, 8003, 8004], Lifetime.NONE),
        FieldChange(("max_servers_per_box",), FleetSettings().max_servers_per_box, 2, Lifetime.NONE),
        FieldChange(("reconcile", "interval_s"), ReconcileSettings().interval_s, 30, Lifetime.LIVE),
        FieldChange(("rollout", "poll_s"), RolloutSettings().poll_s, 60, Lifetime.LIVE))


def route(model: str = "m1") -> Route:
    return Route(model, model, {}, {}, "derived from b:8001")


def changes(deletes: int, replaces: int = 0, others: int = 0) -> tuple[DeploymentChange, ...]:
    return (*(DeploymentChange(DeploymentAction.DELETE, "b", 8000 + i, route(), None) for i in range(deletes)),
            *(DeploymentChange(DeploymentAction.REPLACE, "c", 8000 + i, route(), route("m2")) for i in range(replaces)),
            *(DeploymentChange(DeploymentAction.CREATE, "d", 8000 + i, None, route()) for i in range(others)),
            *(DeploymentChange(DeploymentAction.UPDATE, "e", 8000 + i, route(), route()) for i in range(others)))


def prune(**knobs: object) -> FleetSettings:
    return FleetSettings(reconcile=ReconcileSettings(**knobs))  # type: ignore[arg-type]


def test_prune_alerts_exactly() -> None:
    settings = prune(prune=False, max_deletes_per_pass=1, max_delete_fraction=0.25)
    assert list(_prune_alerts(settings, changes(1, replaces=1, others=3), 4)) == [
        Alert(Level.WARNING, "prune-off", "2 LiteLLM deployments to delete, but prune is off in fleet.yaml: they "
              "stay in LiteLLM until deleted by hand", "reconcile.prune"),
        Alert(Level.WARNING, "delete-budget", "2 LiteLLM deployments to delete: more than one reconcile pass "
              "deletes (max_deletes_per_pass: 1)", "reconcile.max_deletes_per_pass"),
        Alert(Level.WARNING, "delete-fraction", "2 of 4 LiteLLM deployments to delete (50%): above "
              "max_delete_fraction (25%)", "reconcile.max_delete_fraction")]
    assert [a.message for a in _prune_alerts(prune(prune=False), changes(1), 100)] == [
        "1 LiteLLM deployment to delete, but prune is off in fleet.yaml: they stay in LiteLLM until deleted by hand"]


def test_prune_alerts_at_their_limits() -> None:
    """Exactly max_deletes_per_pass deletions, exactly max_delete_fraction of the deployments: no alert."""
    at_limit = prune(max_deletes_per_pass=2, max_delete_fraction=0.5)
    assert list(_prune_alerts(at_limit, changes(2, others=5), 4)) == []
    assert codes_of(_prune_alerts(at_limit, changes(3), 6)) == ["delete-budget"]
    assert codes_of(_prune_alerts(prune(max_delete_fraction=0.5), changes(3), 5)) == ["delete-fraction"]
    assert list(_prune_alerts(prune(prune=False), changes(0, others=3), 3)) == []  # nothing to delete
    assert list(_prune_alerts(prune(max_delete_fraction=0.1), changes(1), 0)) == []  # no deployment before


def codes_of(alerts: Iterable[Alert]) -> list[str]:
    return [a.code for a in alerts]


def test_alert_messages_exactly() -> None:
    paused_box = "hosts:\n  203.0.113.10:\n    reconcile: paused\n    servers:\n      - [m1, 8001]\n      - [m2, 8002]\n"
    fleet = FLEET + "reconcile: {max_delete_fraction: 0.5}\n"
    report = diff({"fleet": fleet, "placement": paused_box + "  203.0.113.11:\n    - [m1, 8001]\n"},
                  {"fleet": fleet, "placement": paused_box.replace("[m2, 8002]", "[m1, 8002, m1-b]")})
    assert report.alerts == (
        Alert(Level.OUTAGE, "last-server", "model m2 loses its last server (203.0.113.10:8002): LiteLLM stops routing "
              "it at the next reconcile and its callers get errors", "m2"),
        Alert(Level.WARNING, "box-removed", "box 203.0.113.11 leaves the fleet: its deployments are deleted at the "
              "next reconcile, and the instance keeps running (and billing) until you destroy it", "203.0.113.11"),
        Alert(Level.WARNING, "delete-fraction", "2 of 3 LiteLLM deployments to delete (67%): above "
              "max_delete_fraction (50%)", "reconcile.max_delete_fraction"),
        Alert(Level.NOTE, "box-paused", "box 203.0.113.10 is paused: the reconciler applies none of its LiteLLM "
              "changes until `reconcile: paused` is removed", "203.0.113.10"),
        Alert(Level.NOTE, "card-size-unknown", "box 203.0.113.10 has no gpu_memory_gb in placement.yaml, so whether "
              "m1 keeps running is not known: counted as restarting", "203.0.113.10"))


def test_no_steady_server_and_a_paused_model_exactly() -> None:
    models = MODELS.replace("  m1:\n", "  m1:\n    reconcile: paused\n")
    report = diff({"models": models, "placement": ONE_BOX},
                  {"models": models.replace("org/m1,", "org/m1-v2,"), "placement": ONE_BOX})
    assert report.alerts == (
        Alert(Level.WARNING, "no-steady-server", "model m1: none of its servers stays as it is (each moves, restarts "
              "or is new): m1 may have no healthy server until they have loaded, unless the boxes restart one at a "
              "time", "m1"),)
    live = diff({"models": models, "placement": ONE_BOX},
                {"models": models + "    litellm: {params: {rpm: 1}}\n", "placement": ONE_BOX})
    assert live.alerts == ()  # m2 changes, but is placed nowhere: no deployment of a paused model changes
    both = diff({"models": models}, {"models": models.replace("org/m1,", "org/m1, served_model_name: x,")})
    assert both.alerts[-1] == Alert(Level.NOTE, "model-paused", "model m1 is paused: the reconciler applies none of "
                                    "its LiteLLM changes until `reconcile: paused` is removed", "m1")


def test_a_model_with_one_steady_server_left_has_no_warning() -> None:
    placement = "hosts:\n  203.0.113.10:\n    - [m1, 8001]\n  203.0.113.11:\n    - [m1, 8001]\n"
    report = diff({"placement": placement}, {"placement": placement.replace("11:\n    - [m1, 8001]",
                                                                           "11:\n    - [m1, 8002]")})
    assert "no-steady-server" not in codes(report)


def test_card_alerts_in_the_singular_and_the_plural() -> None:
    two = "hosts:\n  203.0.113.10:\n    - [m1, 8001]\n    - [m1, 8002, m1-b]\n"
    report = diff({"placement": two}, {"placement": two + "    - [m2, 8003]\n"})
    assert [a.message for a in report.alerts] == [
        "box 203.0.113.10 has no gpu_memory_gb in placement.yaml, so whether m1, m1-b keep running is not known: "
        "counted as restarting"]
    # m1 alone has 0.9 of a 64 GB card; m2 (30 GB of weights) does not fit beside it: divided afresh
    card = "hosts:\n  203.0.113.10:\n    gpu_memory_gb: 64\n    servers:\n      - [m1, 8001]\n"
    full = MODELS.replace("vram_gb: 10,", "vram_gb: 30,")
    one = diff({"models": full, "placement": card}, {"models": full, "placement": card + "      - [m2, 8002]\n"})
    assert one.alerts[-1] == Alert(Level.WARNING, "card-redivided", "box 203.0.113.10: the servers that start or "
                                   "change on it do not fit around the running servers' shares of the card, so the "
                                   "card is divided afresh and m1 (unchanged) restarts too", "203.0.113.10")


@pytest.mark.parametrize(("value", "shown"), [
    (ABSENT, "(absent)"), (None, "null"), ("h\u00e9", '"h\u00e9"'), ({"a": [1, 2.5]}, '{"a": [1, 2.5]}'),
    (True, "true")])
def test_show(value: JSON, shown: str) -> None:
    assert show(value) == shown


@pytest.mark.parametrize(("a", "b", "equal"), [
    (1, 1.0, True), (1, True, False), (True, True, True), (True, False, False), ("1", 1, False), (None, None, True),
    (ABSENT, ABSENT, True), (ABSENT, None, False), (None, ABSENT, False), ([1, 2], [1.0, 2], True),
    ([1, 2], [1, 2, 3], False), ([1], [True], False), ({"a": 1}, {"a": 1.0}, True), ({"a": 1}, {"b": 1}, False),
    ({"a": 1}, {"a": 2}, False), ({"a": [1]}, {"a": [1], "b": 2}, False), ([], {}, False), ("a", "a", True),
    ("a", "b", False), (0, False, False), (0.5, 0.25, False), ([], "", False), ({}, "", False)])
def test_same_compares_as_json_readers_do(a: JSON, b: JSON, equal: bool) -> None:
    assert same(a, b) is equal and same(b, a) is equal


def test_summary_lines_in_the_singular_and_the_plural() -> None:
    gone = "hosts:\n  203.0.113.12:\n    - [m1, 8001]\n    - [m2, 8002]\n"
    assert summary_line(diff({"placement": TWO_BOXES}, {"placement": gone})) == (
        "1 new box to provision; 2 boxes removed; LiteLLM: 2 to create, 3 to delete.")
    three = TWO_BOXES + "  203.0.113.12:\n    - [m1, 8001]\n"
    assert summary_line(diff({"placement": three}, {"placement": ONE_BOX.replace(".10", ".13")
                                                    + "  203.0.113.14:\n    - [m1, 8001]\n"})) == (
        "2 new boxes to provision; 3 boxes removed; LiteLLM: 2 to create, 4 to delete; 1 model loses its last server.")
    models = MODELS + "  m3:\n    vllm: {model: org/m3}\n"
    placement = PLACEMENT + "  203.0.113.11:\n    - [m3, 8001]\n"
    assert summary_line(diff({"models": models, "placement": placement}, {"models": models, "placement": ONE_BOX})) \
        == "1 box must restart vLLM; 1 box removed; LiteLLM: 2 to delete; 2 models lose their last server."


def test_a_change_of_max_unavailable_alone_is_a_reconciler_setting() -> None:
    report = diff({}, {"models": MODELS.replace("  m2:\n", "  m2:\n    max_unavailable: 2\n")})
    assert summary_line(report) == "Reconciler settings change."
    assert codes(report) == [] and report.deployments == ()


def test_a_box_detail_of_boot_lifetime_restarts_the_box() -> None:
    gateway = "hosts:\n  203.0.113.10:\n    gateway: 8001\n    servers:\n      - [m1, 9001]\n"
    (box,) = diff({"placement": gateway}, {"placement": gateway.replace("gateway: 8001", "gateway: 8002")}).boxes
    assert (box.status, box.details) == (BoxStatus.RESTART, (FieldChange(("gateway",), 8001, 8002, Lifetime.BOOT),))


def test_a_model_losing_several_servers_names_them_all() -> None:
    report = diff({"placement": TWO_BOXES}, {"placement": TWO_BOXES.replace("[m1, 8001]", "[m2, 8001, m2-b]")})
    assert report.alerts[0] == Alert(Level.OUTAGE, "last-server", "model m1 loses its last server (203.0.113.10:8001, "
                                     "203.0.113.11:8001): LiteLLM stops routing it at the next reconcile and its "
                                     "callers get errors", "m1")


def test_deployments_of_a_paused_box_or_model_say_so_whichever_side_pauses() -> None:
    paused = "hosts:\n  203.0.113.10:\n    reconcile: paused\n    servers:\n      - [m1, 8001]\n"
    created = diff({"placement": ONE_BOX.replace(".10", ".11")}, {"placement": paused + "  203.0.113.11:\n"
                                                                               "    - [m1, 8001]\n"})
    assert [(d.action, d.address, d.paused) for d in created.deployments] == [
        (DeploymentAction.CREATE, "203.0.113.10:8001", True)]
    deleted = diff({"placement": paused + "  203.0.113.11:\n    - [m1, 8001]\n"}, {"placement": ONE_BOX.replace(
        ".10", ".11")})
    assert [(d.action, d.address, d.paused) for d in deleted.deployments] == [
        (DeploymentAction.DELETE, "203.0.113.10:8001", True)]
    models = MODELS.replace("org/m1,", "org/m1, served_model_name: chat,")
    for base, head in ((paused, ONE_BOX), (ONE_BOX, paused)):
        (update,) = diff({"placement": base}, {"models": models, "placement": head}).deployments
        assert (update.action, update.paused) == (DeploymentAction.UPDATE, True)
    (steady,) = diff({"placement": ONE_BOX}, {"models": models, "placement": ONE_BOX}).deployments
    assert not steady.paused


def test_a_model_new_and_paused_at_head_has_no_paused_note() -> None:
    """Its deployments are created paused and say so themselves; the note is for a model already there."""
    models = MODELS + "  m3:\n    reconcile: paused\n    vllm: {model: org/m3}\n"
    report = diff({}, {"models": models, "placement": PLACEMENT + "  203.0.113.11:\n    - [m3, 8001]\n"})
    assert [(d.address, d.paused) for d in report.deployments] == [("203.0.113.11:8001", True)]
    assert "model-paused" not in codes(report)
