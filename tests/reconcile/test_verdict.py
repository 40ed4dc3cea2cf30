"""Table tests for the judge: every verdict, and the hysteresis transitions."""

from __future__ import annotations

import dataclasses

import pytest

from fleetllm.core.fleet.model import Provider
from fleetllm.core.judge.intended import Endpoint
from fleetllm.core.judge.observed import (
    BoxFacts,
    ProbeResult,
    ProbeStatus,
    ProviderBox,
    ProviderListing,
    Resolution,
)
from fleetllm.core.judge.verdict import (
    Availability,
    ProbeOutcome,
    ServerHistory,
    Verdict,
    advance,
    judge,
    rollup,
)

from .builders import NOW, SETTINGS, failed, ok, reported, server, up_history

S = server("127.0.0.2", 8001, "m")
HERE = Resolution(Endpoint("127.0.0.2", 8001))
FRESH = ServerHistory(first_seen=NOW)
FETCHED_RECENTLY = BoxFacts(fetched_at=NOW - 60)
FETCHED_LONG_AGO = BoxFacts(fetched_at=NOW - 3600)
DOWN = ServerHistory(first_seen=NOW - 7200, up=False, ever_up=True, fail_streak=3, recent="00011",
                     last_healthy=NOW - 600, down_since=NOW - 300)


def after(history: ServerHistory, *outcomes: ProbeOutcome) -> ServerHistory:
    for i, outcome in enumerate(outcomes):
        history = advance(history, outcome, NOW + i, SETTINGS)
    return history


G, F, INC = ProbeOutcome.GOOD, ProbeOutcome.FAILED, ProbeOutcome.INCONCLUSIVE

CASES = [
    # (name, resolution, probe, history-after, facts, verdict, words in the reason)
    ("pending: never fetched, refused", HERE, failed(), FRESH, BoxFacts(), Verdict.PENDING, "never fetched"),
    ("loading: fetched 60s ago, refused", HERE, failed(), FRESH, FETCHED_RECENTLY, Verdict.LOADING, "grace 600s"),
    ("loading: no public port yet", Resolution(None, note="vast instance 1 is loading"),
     ProbeResult(ProbeStatus.NO_ENDPOINT, "no public port for listen port 8001 yet"), FRESH, FETCHED_RECENTLY,
     Verdict.LOADING, "no public port"),
    ("stalled: past grace", HERE, failed(ProbeStatus.TIMEOUT), FRESH, FETCHED_LONG_AGO, Verdict.STALLED,
     "never healthy within 600s"),
    ("stalled: re-fetching does not restart the grace", HERE, failed(),
     dataclasses.replace(FRESH, loading_since=NOW - 3600), FETCHED_RECENTLY, Verdict.STALLED, "60m ago"),
    ("healthy: first good probe", HERE, ok(S), after(FRESH, G), FETCHED_RECENTLY, Verdict.HEALTHY, "serves m"),
    ("healthy: one failure is not down", HERE, failed(), after(up_history(), F), FETCHED_LONG_AGO,
     Verdict.HEALTHY, "1 failed probe"),
    ("down: three failures", HERE, failed(), after(up_history(), F, F, F), FETCHED_LONG_AGO, Verdict.DOWN,
     "was healthy"),
    ("down: recovering needs two good probes", HERE, ok(S), after(DOWN, G), FETCHED_LONG_AGO, Verdict.DOWN,
     "1 of 2"),
    ("healthy again after two good probes", HERE, ok(S), after(DOWN, G, G), FETCHED_LONG_AGO, Verdict.HEALTHY,
     "serves"),
    ("loading again: down box re-fetched its config", HERE, failed(), DOWN, BoxFacts(fetched_at=NOW - 30),
     Verdict.LOADING, "fetched its config"),
    ("stale: max_model_len differs", HERE, ok(S, max_model_len=2048), after(FRESH, G), FETCHED_LONG_AGO,
     Verdict.STALE, "max_model_len 2048"),
    ("stale: weights differ", HERE, ok(S, root="org/old"), after(FRESH, G), FETCHED_LONG_AGO, Verdict.STALE,
     "weights org/old"),
    ("stale: reported digest differs", HERE, ok(S), after(FRESH, G),
     BoxFacts(NOW - 60, reported("b" * 40, {"m": "sha256:old"}, NOW - 50)), Verdict.STALE, "revision bbbb"),
    ("healthy: reported digest matches", HERE, ok(S), after(FRESH, G),
     BoxFacts(NOW - 60, reported("a" * 40, {"m": S.digest}, NOW - 50)), Verdict.HEALTHY, "serves"),
    ("gateway: routes fewer models than placed", HERE, ok(S, gateway_models=1), after(FRESH, G), FETCHED_LONG_AGO,
     Verdict.STALE, "routes 1 model(s), the placement puts 2"),
    ("gateway: routes what the placement puts behind it", HERE, ok(S, gateway_models=2), after(FRESH, G),
     FETCHED_LONG_AGO, Verdict.HEALTHY, "serves"),
    ("foreign: bearer rejected", HERE, ProbeResult(ProbeStatus.UNAUTHORIZED, "GET /v1/models rejects our bearer"),
     after(up_history(), F), FETCHED_LONG_AGO, Verdict.FOREIGN, "rejects our bearer"),
    ("foreign: another model", HERE, ProbeResult(ProbeStatus.WRONG_MODEL, "GET /v1/models lists x, not m"),
     after(FRESH, F), FETCHED_LONG_AGO, Verdict.FOREIGN, "not m"),
    ("foreign: not vLLM", HERE, ProbeResult(ProbeStatus.BAD_REPLY, "GET /v1/models: not JSON"), FRESH,
     FETCHED_LONG_AGO, Verdict.FOREIGN, "not JSON"),
    ("missing: provider lists no such box", Resolution(None, listed=False), None, after(up_history(), F, F, F),
     FETCHED_LONG_AGO, Verdict.MISSING, "has no box"),
    ("missing once is not missing yet (vast)", Resolution(None, listed=False), None, after(up_history(), F),
     FETCHED_LONG_AGO, Verdict.HEALTHY, "1 pass(es) in a row, Missing after 3"),
    ("missing: never served, missing at once", Resolution(None, listed=False), None, after(FRESH, F),
     FETCHED_LONG_AGO, Verdict.MISSING, "has no box"),
    ("unknown: listing failed", Resolution(None, unknown="the vast listing failed: HTTP 503"), None, up_history(),
     FETCHED_LONG_AGO, Verdict.UNKNOWN, "HTTP 503"),
    ("unknown: our probe failed", HERE, ProbeResult(ProbeStatus.ERROR, "cannot resolve the host"), up_history(),
     FETCHED_LONG_AGO, Verdict.UNKNOWN, "cannot resolve"),
]


@pytest.mark.parametrize(("name", "resolution", "probe", "history", "facts", "verdict", "words"), CASES,
                         ids=[c[0] for c in CASES])
def test_verdict_table(name: str, resolution: Resolution, probe: ProbeResult | None, history: ServerHistory,
                       facts: BoxFacts, verdict: Verdict, words: str) -> None:
    s = dataclasses.replace(S, provider=Provider.VAST) if "vast" in name or "missing" in name else S
    if name.startswith("gateway"):
        s = dataclasses.replace(s, gateway_port=8003, gateway_models=2)
    judgement = judge(s, resolution, probe, history, facts, SETTINGS, NOW)
    assert judgement.verdict is verdict, judgement.reason
    assert words in judgement.reason
    assert "\n" not in judgement.reason


def test_every_verdict_is_covered_by_the_table() -> None:
    assert {c[5] for c in CASES} == set(Verdict)


def test_loading_since_is_pinned_until_up_or_a_restart_after_down() -> None:
    from fleetllm.core.judge.verdict import note_fetch

    h = note_fetch(FRESH, 100.0)
    assert h.loading_since == 100.0
    assert note_fetch(h, 200.0).loading_since == 100.0
    assert note_fetch(dataclasses.replace(h, up=True), 300.0).loading_since is None
    down = dataclasses.replace(DOWN, loading_since=None)
    assert note_fetch(down, NOW - 400).loading_since == NOW - 400  # fetched before it went down: first seen
    assert note_fetch(note_fetch(down, NOW - 400), NOW - 10).loading_since == NOW - 10  # restarted after down


def test_unknown_leaves_history_untouched() -> None:
    h = up_history()
    assert advance(h, INC, NOW, SETTINGS) == h


def test_alternating_probes_go_down_and_stay_down() -> None:
    """The reference system stayed Healthy when every other probe failed; a window catches it."""
    h = up_history()
    states = []
    for outcome in [F, G] * 6:
        h = advance(h, outcome, NOW, SETTINGS)
        states.append(h.up)
    assert not h.up
    assert states.index(False) <= 4
    assert not any(states[states.index(False):])


def test_down_recovers_only_after_m_consecutive_good_probes() -> None:
    h = after(up_history(), F, F, F)
    assert not h.up
    assert h.ever_up
    h = after(h, G, F, G)
    assert not h.up
    h = after(h, G)
    assert h.up


def test_first_good_probe_is_enough_for_a_new_server() -> None:
    assert after(FRESH, G).up


def test_rollup() -> None:
    assert rollup([Verdict.HEALTHY, Verdict.STALE]).availability is Availability.AVAILABLE
    assert rollup([Verdict.HEALTHY, Verdict.UNKNOWN]).availability is Availability.DEGRADED
    assert rollup([Verdict.DOWN, Verdict.LOADING]).availability is Availability.UNAVAILABLE
    assert rollup([]).availability is Availability.UNAVAILABLE


def test_resolution_from_listings() -> None:
    from fleetllm.core.judge.observed import resolve_endpoint

    vast = dataclasses.replace(S, box="192.0.2.45", provider=Provider.VAST)
    good = ProviderListing(Provider.VAST, {"192.0.2.45": ProviderBox(
        "192.0.2.45", {8001: Endpoint("192.0.2.45", 41234)}, ident="instance 312")})
    assert resolve_endpoint(vast, {Provider.VAST: good}).endpoint == Endpoint("192.0.2.45", 41234)
    assert not resolve_endpoint(vast, {Provider.VAST: ProviderListing(Provider.VAST, {})}).listed
    assert resolve_endpoint(vast, {Provider.VAST: ProviderListing(Provider.VAST, error="boom")}).unknown
    # No vast key configured: the box contract's "public equals listen", marked as assumed.
    assumed = resolve_endpoint(vast, {})
    assert assumed.endpoint == Endpoint("192.0.2.45", 8001) and assumed.assumed and assumed.unknown is None
    assert resolve_endpoint(dataclasses.replace(vast, pinned_public_port=16643), {}).endpoint == Endpoint(
        "192.0.2.45", 16643)
    pod = dataclasses.replace(S, box="k7v2m9x4q1w8e3", provider=Provider.RUNPOD)  # a pod id is no address
    assert resolve_endpoint(pod, {}).endpoint is None
    assert "k7v2m9x4q1w8e3 is not an address (a pod id)" in (resolve_endpoint(pod, {}).unknown or "")
    pinned = dataclasses.replace(vast, pinned_public_port=16643)
    assert resolve_endpoint(pinned, {Provider.VAST: good}).endpoint == Endpoint("192.0.2.45", 16643)
    static = dataclasses.replace(S, pinned_public_port=9000)
    assert resolve_endpoint(static, {}).endpoint == Endpoint("127.0.0.2", 9000)
