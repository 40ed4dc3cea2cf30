"""Build fleet snapshots from YAML strings, without touching the disk."""

from __future__ import annotations

from fleetllm.core.fleet.diagnostics import Diagnostic
from fleetllm.core.fleet.files import FLEET_FILES, Snapshot
from fleetllm.core.fleet.validate import Validation, validate_snapshot

FLEET = "listen_ports: [8001, 8002, 8003]\n"
MODELS = """\
models:
  m1:
    vllm: {model: org/m1, max_model_len: 4096, vram_gb: 10, disk_gb: 20}
  m2:
    vllm: {model: org/m2, vram_gb: 30, disk_gb: 40}
"""
PLACEMENT = """\
hosts:
  203.0.113.10:
    - [m1, 8001]
    - [m2, 8002]
"""


def snapshot(fleet: str = FLEET, models: str = MODELS, placement: str = PLACEMENT,
             revision: str = "rev1") -> Snapshot:
    texts = dict(zip(FLEET_FILES, (fleet, models, placement), strict=True))
    return Snapshot(revision, {k: v.encode() for k, v in texts.items()}, {k: k for k in FLEET_FILES})


def validate(**files: str) -> Validation:
    return validate_snapshot(snapshot(**files))


def only(validation: Validation, rule: str) -> Diagnostic:
    found = [d for d in validation.diagnostics if d.rule == rule]
    assert len(found) == 1, [d.text() for d in validation.diagnostics]
    return found[0]
