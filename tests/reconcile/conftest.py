"""Fixtures for the reconciler's integration tests: the real LiteLLM proxy (skipped when absent)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.integration import missing
from tests.support.litellm import SKIP_REASON, LitellmProxy, proxy_from_env


@pytest.fixture
def litellm() -> Iterator[LitellmProxy]:
    """The real proxy, with every managed or test deployment removed before and after the test."""
    proxy = proxy_from_env()
    if proxy is None:
        missing(SKIP_REASON)
    status, _ = proxy.call("GET", "/health/readiness", timeout=10)
    if status != 200:
        pytest.fail(f"the LiteLLM proxy at {proxy.url} is not ready (GET /health/readiness: {status})")
    proxy.reset()
    yield proxy
    proxy.reset()
