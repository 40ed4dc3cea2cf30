"""The one rule for routing a server LiteLLM does not route to now (issue 27): its verdict serves and a
probe of this pass succeeded. The planner creates by it; the rollout step counts servers up by it."""

from __future__ import annotations

import pytest

from fleetllm.core.judge.observed import ProbeResult, ProbeStatus
from fleetllm.core.judge.verdict import SERVING, Verdict, serving_now

OK = ProbeResult(ProbeStatus.OK)


@pytest.mark.parametrize("verdict", list(Verdict))
def test_a_good_probe_routes_exactly_the_serving_verdicts(verdict: Verdict) -> None:
    assert serving_now(verdict, OK) is (verdict in SERVING)


@pytest.mark.parametrize("status", [s for s in ProbeStatus if s is not ProbeStatus.OK])
@pytest.mark.parametrize("verdict", sorted(SERVING))
def test_serving_by_hysteresis_without_a_good_probe_is_not_serving_now(verdict: Verdict,
                                                                        status: ProbeStatus) -> None:
    assert serving_now(verdict, ProbeResult(status)) is False


@pytest.mark.parametrize("verdict", list(Verdict))
def test_not_probed_this_pass_is_not_serving_now(verdict: Verdict) -> None:
    assert serving_now(verdict, None) is False
