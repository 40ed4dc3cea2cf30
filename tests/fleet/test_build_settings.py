"""fleetllm.core.fleet.build.build_settings, directly: every setting read from fleet.yaml, and each one that a
schema error taints falls back to its default. Mutation testing (docs/testing.md) showed these only
loosely pinned through whole-fleet tests."""

from __future__ import annotations

from fleetllm.core.fleet.build import build_settings
from fleetllm.core.fleet.model import FleetSettings, ReconcileSettings

DOC = {
    "listen_ports": [8001, 8002, "x", 8005],
    "legacy_servers": [{"host": "198.51.100.23", "port": 8000}, {"host": "h", "port": "8000"}, "junk",
                       {"host": "198.51.100.24", "port": 8001}],
    "reconcile": {"interval_s": 30, "prune": False, "unknown_knob": 1, "max_delete_fraction": 0.5},
    "max_servers_per_box": 2,
    "allow_empty_placement": True,
}


def test_every_setting_is_read() -> None:
    assert build_settings(DOC, set()) == FleetSettings(  # type: ignore[arg-type]
        listen_ports=(8001, 8002, 8005), max_servers_per_box=2, allow_empty_placement=True,
        legacy_servers=frozenset({("198.51.100.23", 8000), ("198.51.100.24", 8001)}),
        reconcile=ReconcileSettings(interval_s=30, prune=False, max_delete_fraction=0.5))


def test_tainted_settings_fall_back_to_their_defaults() -> None:
    errors = {("listen_ports", 2), ("legacy_servers", 0), ("reconcile", "interval_s")}
    settings = build_settings(DOC, errors)  # type: ignore[arg-type]
    assert settings.listen_ports == FleetSettings().listen_ports
    assert settings.legacy_servers == frozenset({("198.51.100.24", 8001)})
    assert settings.reconcile == ReconcileSettings(prune=False, max_delete_fraction=0.5)
    assert settings.max_servers_per_box == 2


def test_defaults_and_bad_values() -> None:
    assert build_settings({}, set()) == FleetSettings()
    assert build_settings("not a mapping", set()) == FleetSettings()  # type: ignore[arg-type]
    odd = build_settings({"listen_ports": [], "max_servers_per_box": 0, "allow_empty_placement": "yes",
                          "reconcile": "fast"}, set())
    assert odd == FleetSettings()
    assert build_settings({"max_servers_per_box": 1}, set()).max_servers_per_box == 1
