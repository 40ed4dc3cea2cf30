"""The waves `llmfleet diff` shows for a change (the staged rollout's real step, idealised fleet)."""

from __future__ import annotations

from pathlib import Path

from llmfleet.core.diff.waves import waves_json, waves_section
from llmfleet.core.fleet.model import Fleet
from llmfleet.core.rollout.waves import plan_waves
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
    assert waves_json(fleet(), fleet(models=models)) == {"waves": 0, "boxes": [], "max_out": {}, "not_released": {}}


def test_the_section_reads_well() -> None:
    section = waves_section(fleet(), fleet(models=MODELS.replace('[--seed, "1"]', '[--seed, "2"]')))
    assert section is not None and section.summary == "3 wave(s), 3 box(es)"
    assert section.lines[:2] == ("  wave 1:", "    box1: drains and restarts m1")
    assert "  m1: at most 1 server(s) out at once (max_unavailable 1)" in section.lines


def test_llmfleet_diff_prints_the_waves(fleet_git: Path) -> None:
    import subprocess
    import sys

    from tests.conftest import ROOT

    models = fleet_git / "models.yaml"
    models.write_text(models.read_text().replace("max-num-batched-tokens: 4096", "max-num-batched-tokens: 8192"))
    git(fleet_git, "commit", "-qam", "boot change")
    out = subprocess.run([sys.executable, "-m", "llmfleet", "diff", "--repo", str(fleet_git), "HEAD~1", "HEAD"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "Rollout (boot changes, box by box, for boxes running the box agent)" in text
    assert "wave 1:\n      203.0.113.10: drains and restarts qwen3-8b" in text
    assert "203.0.113.24: drains and restarts qwen3-8b, qwen3-8b-b" in text


def test_rollout_settings_and_overrides_show_in_the_report() -> None:
    from llmfleet.core.diff import diff_fleets

    models = MODELS.replace("  m2:\n", "  m2:\n    max_unavailable: 2\n")
    placement = PLACEMENT.replace("  box2:\n    - [m1, 8001]\n", "  box2:\n    rollout: manual\n    servers:\n"
                                  "      - [m1, 8001]\n")
    report = diff_fleets(fleet(), fleet(models=models, placement=placement,
                                        fleet_yaml="version: 1\nrollout: {drain_s: 30}\n"))
    assert [(f.path, f.before, f.after) for f in report.settings] == [(("rollout", "drain_s"), 10, 30)]
    assert [f.path for r in report.recipes for f in r.fields] == [("max_unavailable",)]
    assert [f.path for b in report.boxes for f in b.details] == [("rollout",)]
