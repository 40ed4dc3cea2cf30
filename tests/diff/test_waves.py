"""The waves `fleetllm diff` shows for a change (the staged rollout's real step, idealised fleet)."""

from __future__ import annotations

from pathlib import Path

from fleetllm.core.diff.waves import waves_json, waves_section
from fleetllm.core.fleet.model import Fleet
from fleetllm.core.rollout.waves import plan_waves
from tests.conftest import git
from tests.fleet.helpers import validate

MODELS = """\
models:
  m1:
    vllm: {model: org/m1, vram_gb: 10, args: [--seed, "1"]}
  m2:
    vllm: {model: org/m2, vram_gb: 10}
"""
PLACEMENT = """\
hosts:
  box1:
    - [m1, 8001]
    - [m2, 8002]
  box2:
    - [m1, 8001]
  box3:
    - [m1, 8001]
    - [m2, 8002]
"""


def fleet(models: str = MODELS, placement: str = PLACEMENT, fleet_yaml: str = "version: 1\n") -> Fleet:
    result = validate(models=models, placement=placement, fleet=fleet_yaml)
    assert result.fleet is not None, [d.text() for d in result.diagnostics]
    return result.fleet


def test_a_recipe_change_goes_one_replica_at_a_time() -> None:
    waves = plan_waves(fleet(), fleet(models=MODELS.replace('[--seed, "1"]', '[--seed, "2"]')))
    assert [(b.box, b.wave, b.restarts) for b in waves.boxes] == [
        ("box1", 1, ("m1",)), ("box2", 2, ("m1",)), ("box3", 3, ("m1",))]
    assert waves.waves == 3 and waves.short == {"m1": 1} and not waves.stuck


def test_a_larger_budget_takes_fewer_waves() -> None:
    changed = MODELS.replace('[--seed, "1"]', '[--seed, "2"]')
    waves = plan_waves(fleet(), fleet(models=changed, fleet_yaml="version: 1\nrollout: {max_unavailable: 2}\n"))
    assert waves.waves == 2 and waves.short == {"m1": 2}


def test_a_move_starts_the_new_server_first() -> None:
    moved = PLACEMENT.replace("  box2:\n    - [m1, 8001]\n", "  box2:\n    - [m1, 8001]\n    - [m2, 8002]\n") \
        .replace("    - [m1, 8001]\n    - [m2, 8002]\n  box2", "    - [m1, 8001]\n  box2", 1)
    waves = plan_waves(fleet(), fleet(placement=moved))
    # box2's m1 runs alone on its card, so it holds the whole share: m2 beside it re-divides the card (the
    # installer would too), and m1 is drained and restarted in the same wave; the new server still comes
    # first, the old one stops only in the next wave
    assert [(b.box, b.wave, b.restarts, b.starts, b.stops) for b in waves.boxes] == [
        ("box2", 1, ("m1",), ("m2",), ()), ("box1", 2, (), (), ("m2",))]


def test_live_only_changes_have_no_waves() -> None:
    models = MODELS.replace("    vllm: {model: org/m2, vram_gb: 10}\n",
                            "    vllm: {model: org/m2, vram_gb: 10}\n    litellm: {params: {temperature: 0.2}}\n")
    assert waves_section(fleet(), fleet(models=models)) is None
    assert waves_json(fleet(), fleet(models=models)) == {"waves": 0, "boxes": [], "max_out": {}, "not_released": {},
                                                         "over_budget": [], "no_server": []}


def test_the_section_reads_well() -> None:
    section = waves_section(fleet(), fleet(models=MODELS.replace('[--seed, "1"]', '[--seed, "2"]')))
    assert section is not None and section.summary == "3 wave(s), 3 box(es)"
    assert section.lines[:2] == ("  wave 1:", "    box1: drains and restarts m1")
    assert "  m1: at most 1 server(s) out at once (max_unavailable 1)" in section.lines


def test_fleetllm_diff_prints_the_waves(fleet_git: Path) -> None:
    import subprocess
    import sys

    from tests.conftest import ROOT

    models = fleet_git / "models.yaml"
    models.write_text(models.read_text().replace("max-num-batched-tokens: 4096", "max-num-batched-tokens: 8192"))
    git(fleet_git, "commit", "-qam", "boot change")
    out = subprocess.run([sys.executable, "-m", "fleetllm", "diff", "--repo", str(fleet_git), "HEAD~1", "HEAD"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "Rollout (boot changes, box by box, for boxes running the box agent)" in text
    assert "wave 1:\n      203.0.113.10: drains and restarts qwen3-8b" in text
    assert "203.0.113.24: drains and restarts qwen3-8b, qwen3-8b-b" in text
    # 2 of qwen3-8b's 3 servers on one box, max_unavailable 1: the report warns, on top
    assert ("\nWARNING rollout: box 203.0.113.24 takes out 2 of qwen3-8b's 3 servers at once, more than its "
            "max_unavailable 1: a box is released whole, so it goes alone (only when no other server of qwen3-8b "
            "is out), and qwen3-8b serves from 1 of 3 until they have loaded. To stay within the budget, spread "
            "qwen3-8b's replicas across boxes, or raise max_unavailable for qwen3-8b in models.yaml to 2; or "
            "accept it\n") in text


def test_rollout_settings_and_overrides_show_in_the_report() -> None:
    from fleetllm.core.diff import diff_fleets

    models = MODELS.replace("  m2:\n", "  m2:\n    max_unavailable: 2\n")
    placement = PLACEMENT.replace("  box2:\n    - [m1, 8001]\n", "  box2:\n    rollout: manual\n    servers:\n"
                                  "      - [m1, 8001]\n")
    report = diff_fleets(fleet(), fleet(models=models, placement=placement,
                                        fleet_yaml="version: 1\nrollout: {drain_s: 30}\n"))
    assert [(f.path, f.before, f.after) for f in report.settings] == [(("rollout", "drain_s"), 10, 30)]
    assert [f.path for r in report.recipes for f in r.fields] == [("max_unavailable",)]
    assert [f.path for b in report.boxes for f in b.details] == [("rollout",)]


TWIN = """\
hosts:
  box1:
    - [m1, 8001]
    - [m1, 8003, m1-b]
    - [m2, 8002]
  box2:
    - [m1, 8001]
  box3:
    - [m2, 8002]
"""
SEED2 = MODELS.replace('[--seed, "1"]', '[--seed, "2"]')


def alert_texts(base: Fleet, head: Fleet) -> list[tuple[str, str, str]]:
    from fleetllm.core.diff.waves import waves_alerts

    return [(a.code, a.subject, a.message) for a in waves_alerts(plan_waves(base, head), head)]


def test_a_box_with_two_of_three_replicas_goes_alone_and_the_diff_warns() -> None:
    from fleetllm.core.rollout.waves import OverBudget

    waves = plan_waves(fleet(placement=TWIN), fleet(models=SEED2, placement=TWIN))
    assert [(b.box, b.wave, b.restarts) for b in waves.boxes] == [("box1", 1, ("m1", "m1-b")), ("box2", 2, ("m1",))]
    assert waves.in_wave(1) == waves.boxes[:1]  # alone: box2's m1 serves meanwhile
    assert waves.over == (OverBudget("box1", "m1", 2, 3, 1),) and waves.dark == () and waves.short == {"m1": 2}
    assert alert_texts(fleet(placement=TWIN), fleet(models=SEED2, placement=TWIN)) == [(
        "rollout-over-budget", "box1",
        "rollout: box box1 takes out 2 of m1's 3 servers at once, more than its max_unavailable 1: a box is "
        "released whole, so it goes alone (only when no other server of m1 is out), and m1 serves from 1 of 3 "
        "until they have loaded. To stay within the budget, spread m1's replicas across boxes, or raise "
        "max_unavailable for m1 in models.yaml to 2; or accept it")]
    raised = SEED2.replace("  m1:\n", "  m1:\n    max_unavailable: 2\n")  # accepted: no warning
    assert alert_texts(fleet(placement=TWIN), fleet(models=raised, placement=TWIN)) == []


def test_a_box_holding_every_server_of_a_model_leaves_it_with_none_and_the_diff_says_so() -> None:
    from fleetllm.core.rollout.waves import Dark

    placement = TWIN.replace("  box2:\n    - [m1, 8001]\n", "  box2:\n    - [m2, 8001]\n")
    base, head = fleet(placement=placement), fleet(models=SEED2, placement=placement)
    waves = plan_waves(base, head)
    assert [(b.box, b.wave) for b in waves.boxes] == [("box1", 1)]
    assert waves.dark == (Dark("m1", ("box1",), 2),) and [o.box for o in waves.over] == ["box1"]
    assert alert_texts(base, head) == [(  # one warning: the no-server one says it all
        "rollout-no-server", "m1",
        "rollout: model m1 has NO server for a while: box box1 holds all 2 of its servers and takes them out at "
        "once (max_unavailable 1), so requests to m1 fail until they have loaded. To keep it serving, place a "
        "replica of m1 on another box; or accept it")]
    # a replica added on another box by the same change serves first (make-before-break): no gap
    spread = placement.replace("  box3:\n    - [m2, 8002]\n", "  box3:\n    - [m2, 8002]\n    - [m1, 8001]\n")
    waves = plan_waves(base, fleet(models=SEED2, placement=spread))
    assert [(b.box, b.wave) for b in waves.boxes] == [("box3", 1), ("box1", 2)] and waves.dark == ()


def test_a_budget_of_every_replica_says_which_boxes_leave_the_model_with_none() -> None:
    placement = "hosts:\n  box1:\n    - [m1, 8001]\n  box2:\n    - [m1, 8001]\n  box3:\n    - [m2, 8002]\n"
    budget = "version: 1\nrollout: {max_unavailable: 2}\n"
    assert alert_texts(fleet(placement=placement), fleet(models=SEED2, placement=placement, fleet_yaml=budget)) == [(
        "rollout-no-server", "m1",
        "rollout: model m1 has NO server for a while: boxes box1, box2 take out all 2 of its servers at once "
        "(max_unavailable 2), so requests to m1 fail until they have loaded. To keep it serving, set "
        "max_unavailable for m1 below 2 in models.yaml, or place a replica on another box; or accept it")]
    single = "hosts:\n  box1:\n    - [m1, 8001]\n  box3:\n    - [m2, 8002]\n"
    assert alert_texts(fleet(placement=single), fleet(models=SEED2, placement=single))[0][2].startswith(
        "rollout: model m1 has NO server for a while: box box1 takes out its only server (max_unavailable 1)")


def test_a_manual_box_over_the_budget_is_a_person_s_restart() -> None:
    manual = TWIN.replace("  box1:\n    - [m1, 8001]\n    - [m1, 8003, m1-b]\n    - [m2, 8002]\n",
                          "  box1:\n    rollout: manual\n    servers:\n      - [m1, 8001]\n"
                          "      - [m1, 8003, m1-b]\n      - [m2, 8002]\n")
    texts = alert_texts(fleet(placement=manual), fleet(models=SEED2, placement=manual))
    assert [t[2] for t in texts] == [
        "rollout: box box1 takes out 2 of m1's 3 servers at once, more than its max_unavailable 1: a person "
        "restarts it (rollout: manual): do so only when no other server of m1 is out, and m1 serves from 1 of 3 "
        "until they have loaded. To stay within the budget, spread m1's replicas across boxes, or raise "
        "max_unavailable for m1 in models.yaml to 2; or accept it"]


def test_the_rollout_warnings_go_with_the_report_s_warnings_before_its_notes() -> None:
    from fleetllm.core.diff.report import Alert, Level
    from fleetllm.core.diff.waves import with_waves_alerts

    base, head = fleet(placement=TWIN), fleet(models=SEED2, placement=TWIN)
    waves = plan_waves(base, head)
    mine = with_waves_alerts((), waves, head)
    assert [a.code for a in mine] == ["rollout-over-budget"]
    out, warn, note = (Alert(Level.OUTAGE, "o", "o", "x"), Alert(Level.WARNING, "w", "w", "x"),
                       Alert(Level.NOTE, "n", "n", "x"))
    assert [a.code for a in with_waves_alerts((out, warn, note), waves, head)] == ["o", "w", "rollout-over-budget",
                                                                                   "n"]
    assert [a.code for a in with_waves_alerts((note,), waves, head)] == ["rollout-over-budget", "n"]
    json = waves_json(base, head, waves)
    assert isinstance(json, dict) and json["over_budget"] == [
        {"box": "box1", "model": "m1", "out": 2, "serving": 3, "max_unavailable": 1}] and json["no_server"] == []
