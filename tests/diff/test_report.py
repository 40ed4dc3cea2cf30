"""The report's classifications, one situation at a time, on fleets written as YAML."""

from __future__ import annotations

from fleetllm.core.diff import diff_fleets, render_text
from fleetllm.core.diff.report import BoxStatus, DeploymentAction, Lifetime, Report, ServerAction
from fleetllm.core.diff.summary import summary_line
from fleetllm.core.fleet.model import Fleet
from tests.fleet.helpers import FLEET, MODELS, PLACEMENT, validate

TWO_BOXES = PLACEMENT + "  203.0.113.11:\n    - [m1, 8001]\n"


def fleet(fleet: str = FLEET, models: str = MODELS, placement: str = PLACEMENT, revision: str = "r") -> Fleet:
    validation = validate(fleet=fleet, models=models, placement=placement)
    assert validation.fleet is not None, [d.text() for d in validation.diagnostics]
    return validation.fleet


def diff(base: dict[str, str], head: dict[str, str]) -> Report:
    return diff_fleets(fleet(**base), fleet(**head))


def codes(report: Report) -> list[str]:
    return [a.code for a in report.alerts]


def test_prune_off_and_deletion_limits_are_flagged() -> None:
    knobs = FLEET + "reconcile: {prune: false, max_deletes_per_pass: 1, max_delete_fraction: 0.5}\n"
    report = diff({"fleet": knobs, "placement": TWO_BOXES},
                  {"fleet": knobs, "placement": "hosts:\n  203.0.113.12:\n    - [m1, 8001]\n"})
    assert codes(report) == ["last-server", "no-steady-server", "box-removed", "box-removed", "prune-off",
                             "delete-budget", "delete-fraction"]
    assert report.alerts[-1].message == ("3 of 3 LiteLLM deployments to delete (100%): above max_delete_fraction "
                                        "(50%)")


def test_a_paused_box_says_its_changes_wait() -> None:
    paused = "hosts:\n  203.0.113.10:\n    reconcile: paused\n    servers:\n      - [m1, 8001]\n      - [m2, 8002]\n"
    report = diff({"placement": paused}, {"placement": paused, "models": MODELS.replace("org/m2", "org/m2-v2")
                                          + "    litellm: {model_info: {tier: gold}}\n"})
    # m2's one server restarts with the same demand on the card (new weights, same vram_gb): it fits in the
    # share it had, so m1 keeps its own even though the card's size is not known
    assert codes(report) == ["no-steady-server", "box-paused"]
    assert report.boxes[0].redivided == () and not report.boxes[0].card_known
    assert "  ~ 203.0.113.10:8002 m2 will be updated (paused: not applied until resumed)" in render_text(report)
    assert report.boxes[0].paused and report.deployments[0].paused


def test_a_paused_model_says_its_changes_wait() -> None:
    models = MODELS.replace("  m2:\n", "  m2:\n    reconcile: paused\n")
    report = diff({"models": models}, {"models": models + "    litellm: {params: {temperature: 0.1}}\n"})
    assert codes(report) == ["model-paused"] and report.deployments[0].paused


def test_box_details_alone_restart_nothing() -> None:
    detailed = "hosts:\n  203.0.113.10:\n    notes: {notes}\n    servers:\n      - [m1, 8001]\n      - [m2, 8002]\n"
    report = diff({"placement": detailed.format(notes="old")}, {"placement": detailed.format(notes="new")})
    assert [(b.status, [f.field for f in b.details]) for b in report.boxes] == [(BoxStatus.CHANGED, ["notes"])]
    assert report.boxes[0].details[0].lifetime is Lifetime.NONE
    assert summary_line(report).startswith("No effect on the running fleet")
    paused = detailed.format(notes="old").replace("    servers:", "    reconcile: paused\n    servers:")
    report = diff({"placement": detailed.format(notes="old")}, {"placement": paused})
    assert summary_line(report) == "Reconciler settings change."


def test_an_unplaced_model_in_the_catalog_has_no_effect() -> None:
    report = diff({}, {"models": MODELS + "  m3:\n    vllm: {model: org/m3}\n"})
    assert [(r.model, r.action, r.servers) for r in report.recipes] == [("m3", "add", 0)]
    assert not report.servers and not report.deployments
    assert "+ model m3 added to the catalog (not placed)" in render_text(report)


def test_served_model_name_is_boot_for_the_box_and_live_for_litellm() -> None:
    report = diff({}, {"models": MODELS.replace("model: org/m1,", "model: org/m1, served_model_name: m1-chat,")})
    assert [(s.action, [f.field for f in s.fields]) for s in report.servers] == [
        (ServerAction.CHANGE, ["served_model_name"])]
    assert [(d.action, [f.field for f in d.fields]) for d in report.deployments] == [
        (DeploymentAction.UPDATE, ["served_model_name"])]


def test_another_model_on_the_same_port_is_a_replacement_and_the_old_one_moves() -> None:
    head = "hosts:\n  203.0.113.10:\n    - [m2, 8001]\n  203.0.113.11:\n    - [m1, 8001]\n"
    report = diff({"placement": "hosts:\n  203.0.113.10:\n    - [m1, 8001]\n"}, {"placement": head})
    assert [(s.action, s.before and s.before.address, s.after and s.after.address) for s in report.servers] == [
        (ServerAction.ADD, None, "203.0.113.10:8001"), (ServerAction.MOVE, "203.0.113.10:8001", "203.0.113.11:8001")]
    assert [(d.action, d.address) for d in report.deployments] == [
        (DeploymentAction.REPLACE, "203.0.113.10:8001"), (DeploymentAction.CREATE, "203.0.113.11:8001")]
    assert "  -/+ 203.0.113.10:8001 m1 -> m2 will be replaced" in render_text(report)
    assert [b.status for b in report.boxes] == [BoxStatus.RESTART, BoxStatus.NEW]


def test_a_move_with_a_new_name_keeps_its_identity() -> None:
    report = diff({"placement": TWO_BOXES},
                  {"placement": PLACEMENT + "  203.0.113.11:\n    - [m1, 8002, m1-bis]\n"})
    (change,) = report.servers
    assert change.action is ServerAction.MOVE and [f.field for f in change.fields] == ["name"]
    assert change.bearer is not None and change.bearer.after == "derived from 203.0.113.11:8002"
    (box,) = report.boxes  # a new process name: Supervisor stops the old program and starts the new one
    assert (box.start, box.restart, box.stop) == (("m1-bis",), (), ("m1",))


def test_numbers_compare_as_json_readers_see_them() -> None:
    def changes(before: str, after: str) -> list[str]:
        report = diff({"models": MODELS + f"    litellm: {{model_info: {{weight: {before}}}}}\n"},
                      {"models": MODELS + f"    litellm: {{model_info: {{weight: {after}}}}}\n"})
        return [f.field for d in report.deployments for f in d.fields]

    assert changes("1", "1.0") == []
    assert changes("[1, 2]", "[1.0, 2]") == []
    assert changes("1", "true") == changes("1", '"1"') == changes("1", "1.5") == ["model_info.weight"]


def test_a_changed_fleet_id_is_flagged_and_naming_a_fleet_is_not() -> None:
    named = FLEET + "fleet_id: blue\n"
    report = diff({"fleet": named}, {"fleet": FLEET + "fleet_id: green\n"})
    assert codes(report) == ["fleet-id-changed"]
    assert report.alerts[0].message.startswith("fleet.yaml fleet_id changes from blue to green: the fleet no longer "
                                               "owns the LiteLLM deployments written as blue")
    assert codes(diff({"fleet": named}, {"fleet": FLEET})) == ["fleet-id-changed"]
    assert codes(diff({"fleet": FLEET}, {"fleet": named})) == []  # naming a fleet: its first id
    assert [f.path for f in diff({"fleet": FLEET}, {"fleet": named}).settings] == [("fleet_id",)]
