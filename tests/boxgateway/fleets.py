"""Gateway fleets for tests: the helpers' baseline with a box gateway, and the example with one added."""

from __future__ import annotations

import shutil
from pathlib import Path

from fleetllm.adapters.git import read_directory
from fleetllm.core.fleet.bearer import Salt
from fleetllm.core.fleet.model import Fleet
from fleetllm.core.fleet.render import Bearers
from fleetllm.core.fleet.validate import validate_snapshot
from tests.conftest import EXAMPLE, TEST_LEGACY_KEY, TEST_SALT
from tests.fleet.helpers import validate

BEARERS = Bearers(Salt(TEST_SALT), TEST_LEGACY_KEY)
BOX = "203.0.113.10"

# Line numbers matter: the rule tests point at them.
GATEWAY_PLACEMENT = """\
hosts:
  203.0.113.10:
    gateway: 8001
    servers:
      - [m1, 9001]
      - [m2, 9002]
"""

# The example's A6000 box with a gateway on 8003: its two qwen3-8b processes share a served name, so
# the second one becomes a coder server instead.
EXAMPLE_EDIT = ("""    servers:
      - [qwen3-8b, 8001]
      - [qwen3-8b, 8002, qwen3-8b-b]
""", """    gateway: 8003
    servers:
      - [qwen3-8b, 8001]
      - [qwen2.5-coder-7b, 8002]
""")
EXAMPLE_GATEWAY_BOX = "203.0.113.24"


def gateway_fleet(placement: str = GATEWAY_PLACEMENT) -> Fleet:
    result = validate(placement=placement)
    assert result.fleet is not None, [d.text() for d in result.diagnostics]
    return result.fleet


def example_with_gateway(target: Path) -> Path:
    """A copy of fleet-repo-example whose box 203.0.113.24 runs a gateway."""
    shutil.copytree(EXAMPLE, target, ignore=shutil.ignore_patterns(".github"))
    placement = target / "placement.yaml"
    text = placement.read_text()
    assert text.count(EXAMPLE_EDIT[0]) == 1
    placement.write_text(text.replace(*EXAMPLE_EDIT))
    return target


def load(directory: Path) -> Fleet:
    validation = validate_snapshot(read_directory(directory))
    assert validation.fleet is not None, [d.text() for d in validation.diagnostics]
    return validation.fleet
