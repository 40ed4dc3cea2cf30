"""The LiteLLM a test writes to: the real proxy when the environment names one (emptied of test
deployments before and after), else the fake of its API on a thread. With FLEETLLM_REQUIRE_INTEGRATION=1
a missing real proxy fails the test: CI must not test silently against the fake."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from tests.reconcile.fakes import FakeLitellmHttp
from tests.support.integration import REQUIRE_ENV, required
from tests.support.litellm import SKIP_REASON, LitellmProxy, proxy_from_env
from tests.support.write_killer import ThreadedServer


@contextmanager
def litellm_upstream(fake_master_key: str) -> Iterator[LitellmProxy]:
    """`fake_master_key`: the fake's master key, recognisable in a secret scan."""
    real = proxy_from_env()
    if real is None and required():
        pytest.fail(f"{REQUIRE_ENV}=1: {SKIP_REASON}", pytrace=False)
    if real is not None:
        real.reset()
        try:
            yield real
        finally:
            real.reset()
        return
    fake = FakeLitellmHttp(master_key=fake_master_key)
    with ThreadedServer(fake.app()) as server:
        yield LitellmProxy(server.url, fake.master_key)
