"""Integration tests that may not skip in CI.

A test that needs something outside Python (a real LiteLLM proxy, PostgreSQL, Chromium, a working
`fleetllm serve`) skips on a developer's machine without it, saying what is missing. With
FLEETLLM_REQUIRE_INTEGRATION=1 (.ci/run sets it) such a skip is a failure instead, so a CI run cannot go
green while a suite did not run. Two ways a test counts as integration:

- it calls `missing(reason)` where it would have called `pytest.skip(reason)` (the fixtures of the real
  LiteLLM and PostgreSQL do), which fails at once under the variable; or
- it is marked `@pytest.mark.integration`: then any skip of it (a `skipif`, an `importorskip`, a fixture's
  `pytest.skip`) is turned into a failure by the report hook below, with the skip's reason.

The variable takes "1" (required) or "0"/empty/unset (not required); any other value stops the run
(a typo such as "true" must not quietly mean "off"). tests/conftest.py loads this module as a plugin.
"""

from __future__ import annotations

import os
from collections.abc import Generator
from typing import NoReturn

import pytest

REQUIRE_ENV = "FLEETLLM_REQUIRE_INTEGRATION"
MARKER = "integration"


def required() -> bool:
    value = os.environ.get(REQUIRE_ENV, "").strip()
    if value not in ("", "0", "1"):
        raise pytest.UsageError(f"{REQUIRE_ENV}={value!r}: use 1 (an integration skip fails) or 0 (it may skip)")
    return value == "1"


def missing(reason: str) -> NoReturn:
    """Skip this test for `reason`; a failure when integration tests are required."""
    if required():
        pytest.fail(f"{REQUIRE_ENV}=1 and this integration test cannot run: {reason}", pytrace=False)
    pytest.skip(reason)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{MARKER}: needs a real service or tool; with {REQUIRE_ENV}=1 a skip "
                                       "of it is a failure")
    required()  # a bad value stops the run before any test


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, object, None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if not (report.skipped and not hasattr(report, "wasxfail") and item.get_closest_marker(MARKER) is not None
            and required()):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    reason = reason.removeprefix("Skipped: ")
    report.outcome = "failed"
    report.longrepr = f"{REQUIRE_ENV}=1 and this integration test skipped: {reason}"
