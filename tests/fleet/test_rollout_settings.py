"""fleet.yaml `rollout:`, placement `rollout:` and models.yaml `max_unavailable` (issue 14)."""

from __future__ import annotations

from fleetllm.core.fleet.model import RolloutMode, RolloutSettings
from tests.fleet.helpers import FLEET, MODELS, PLACEMENT, validate

TWO_BOXES = ("hosts:\n  203.0.113.10:\n    rollout: manual\n    servers:\n      - [m1, 8001]\n"
             "  203.0.113.11:\n    - [m2, 8001]\n")


def test_defaults_when_fleet_yaml_says_nothing() -> None:
    result = validate()
    assert result.fleet is not None
    assert result.fleet.settings.rollout == RolloutSettings(RolloutMode.AUTO, 1, 30, 10)
    assert result.fleet.rollout_mode("203.0.113.10") is RolloutMode.AUTO
    assert result.fleet.max_unavailable("m1") == 1


def test_every_knob_is_read() -> None:
    fleet = FLEET + "rollout:\n  mode: manual\n  max_unavailable: 2\n  poll_s: 60\n  drain_s: 0\n"
    result = validate(fleet=fleet)
    assert result.fleet is not None and not result.errors
    assert result.fleet.settings.rollout == RolloutSettings(RolloutMode.MANUAL, 2, 60, 0)


def test_per_box_and_per_model_overrides() -> None:
    models = MODELS.replace("  m2:\n", "  m2:\n    max_unavailable: 3\n")
    result = validate(fleet=FLEET + "rollout:\n  max_unavailable: 2\n", models=models, placement=TWO_BOXES)
    assert result.fleet is not None and not result.errors, [d.text() for d in result.diagnostics]
    assert result.fleet.rollout_mode("203.0.113.10") is RolloutMode.MANUAL
    assert result.fleet.rollout_mode("203.0.113.11") is RolloutMode.AUTO
    assert result.fleet.rollout_mode("not-a-box") is RolloutMode.AUTO
    assert result.fleet.max_unavailable("m1") == 2 and result.fleet.max_unavailable("m2") == 3


def test_bad_values_name_the_file_and_the_field() -> None:
    result = validate(fleet=FLEET + "rollout:\n  max_unavailable: 0\n  mode: fast\n  poll_s: 2\n  drain_s: -1\n")
    texts = [d.text() for d in result.diagnostics]
    assert any(t.startswith("fleet.yaml:3:") and "/rollout/max_unavailable: 0 is less than the minimum of 1" in t
               for t in texts), texts
    assert any("fleet.yaml:4:" in t and "/rollout/mode: 'fast' is not one of" in t for t in texts), texts
    assert any("/rollout/poll_s: 2 is less than the minimum of 5" in t for t in texts), texts
    assert any("/rollout/drain_s" in t for t in texts), texts
    assert result.fleet is None


def test_bad_model_and_box_overrides_name_their_file() -> None:
    models = MODELS.replace("  m2:\n", "  m2:\n    max_unavailable: 0\n")
    placement = TWO_BOXES.replace("rollout: manual", "rollout: sometimes")
    texts = [d.text() for d in validate(models=models, placement=placement).diagnostics]
    assert any(t.startswith("models.yaml:") and "/models/m2/max_unavailable: 0" in t for t in texts), texts
    assert any(t.startswith("placement.yaml:") and "/hosts/203.0.113.10/rollout: 'sometimes'" in t
               for t in texts), texts


def test_the_example_placement_is_untouched_by_default() -> None:
    assert PLACEMENT.startswith("hosts:")
