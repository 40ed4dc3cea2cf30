"""Debian's Chromium for the browser tests of the pages (tests/pages/test_browser.py, test_sso_browser.py):
where it is, how it is started, the marks that make a missing one a failure in CI, and a wait."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
# A module's pytestmark: integration (with FLEETLLM_REQUIRE_INTEGRATION=1 a missing browser fails the run).
NEEDS_CHROMIUM = [pytest.mark.integration,
                  pytest.mark.skipif(not CHROMIUM.is_file(), reason=f"no browser at {CHROMIUM}: apt-get install -y "
                                     "chromium (.ci/run installs it; Playwright must not download one)")]


def wait_for(what: str, check: Any, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)
