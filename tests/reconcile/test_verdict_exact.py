"""Exact values of the judge's pieces that mutation testing (docs/testing.md) showed were not pinned: the
probe outcome table, seeded histories, each field `advance` writes, the hysteresis window's length, the
fetch pinning boundaries, "ago" texts, reasons, and the roll-ups' counts."""

from __future__ import annotations

import dataclasses

import pytest

from fleetllm.core.judge.intended import Endpoint
from fleetllm.core.judge.observed import BoxFacts, ProbeResult, ProbeStatus, Resolution
from fleetllm.core.judge.verdict import (
    Availability,
    Judgement,
    ProbeOutcome,
    ServerHistory,
    Verdict,
    _ago,
    advance,
    judge,
    note_fetch,
    outcome_of,
    rollup,
    rollups,
    seeded_history,
)

from .builders import NOW, SETTINGS, reported, server

S = server("127.0.0.2", 8001, "m")
HERE = Resolution(Endpoint("127.0.0.2", 8001))
NO_FACTS = BoxFacts()


@pytest.mark.parametrize(("resolution", "probe", "expected"), [
    (Resolution(None, unknown="listing down"), ProbeResult(ProbeStatus.OK), ProbeOutcome.INCONCLUSIVE),
    (Resolution(None, listed=False), None, ProbeOutcome.FAILED),
    (HERE, None, ProbeOutcome.INCONCLUSIVE),
    (HERE, ProbeResult(ProbeStatus.ERROR), ProbeOutcome.INCONCLUSIVE),
    (HERE, ProbeResult(ProbeStatus.OK), ProbeOutcome.GOOD),
    (HERE, ProbeResult(ProbeStatus.REFUSED), ProbeOutcome.FAILED),
])
def test_outcome_table(resolution: Resolution, probe: ProbeResult | None, expected: ProbeOutcome) -> None:
    assert outcome_of(resolution, probe) is expected


def test_seeded_histories() -> None:
    assert seeded_history(NOW, True) == ServerHistory(first_seen=NOW, up=True, ever_up=True, last_healthy=NOW)
    assert seeded_history(NOW, False) == ServerHistory(first_seen=NOW)


def run(history: ServerHistory, outcomes: str, start: float = NOW) -> list[ServerHistory]:
    seen = []
    for i, c in enumerate(outcomes):
        history = advance(history, ProbeOutcome.GOOD if c == "1" else ProbeOutcome.FAILED, start + i, SETTINGS)
        seen.append(history)
    return seen


def test_advance_writes_every_field() -> None:
    up = ServerHistory(first_seen=NOW - 100, up=True, ever_up=True, ok_streak=4, recent="11", last_healthy=NOW - 10)
    f1, f2, f3 = run(up, "000")
    assert f1 == dataclasses.replace(up, ok_streak=0, fail_streak=1, recent="110")
    assert f2 == dataclasses.replace(up, ok_streak=0, fail_streak=2, recent="1100")
    assert f3 == dataclasses.replace(up, up=False, ok_streak=0, fail_streak=3, recent="11000", down_since=NOW + 2)
    g1, g2 = run(f3, "11", start=NOW + 10)
    assert g1 == dataclasses.replace(f3, ok_streak=1, fail_streak=0, recent="10001", last_healthy=NOW + 10)
    assert g2 == dataclasses.replace(f3, up=True, ok_streak=2, fail_streak=0, recent="00011", last_healthy=NOW + 11,
                                     down_since=None)
    fresh = run(ServerHistory(first_seen=NOW), "1")[0]
    assert fresh == ServerHistory(first_seen=NOW, up=True, ever_up=True, ok_streak=1, recent="1", last_healthy=NOW)
    never = run(ServerHistory(first_seen=NOW), "0")[0]
    assert never == ServerHistory(first_seen=NOW, fail_streak=1, recent="0")  # never up: never goes Down


def test_the_window_is_two_n_minus_one_probes() -> None:
    up = ServerHistory(first_seen=NOW, up=True, ever_up=True)
    # Three failures within 6 probes: only two of them inside the last 5 (2*3-1), so still up.
    assert run(up, "011010")[-1].up
    assert run(up, "01010")[-1].up is False  # three within 5: down
    assert run(up, "1" * 9)[-1].recent == "11111"


def test_fetch_pinning_boundaries() -> None:
    down = ServerHistory(first_seen=NOW - 500, ever_up=True, down_since=NOW - 100, loading_since=NOW - 100)
    assert note_fetch(down, NOW - 100).loading_since == NOW - 100  # not after going down: no restart
    assert note_fetch(down, NOW - 50).loading_since == NOW - 50  # since == down_since, fetched after: restart
    up = ServerHistory(first_seen=NOW, up=True, loading_since=NOW - 5)
    assert note_fetch(up, NOW).loading_since is None
    clean = ServerHistory(first_seen=NOW, up=True)
    assert note_fetch(clean, NOW) is clean


@pytest.mark.parametrize(("seconds", "text"), [(-5, "0s ago"), (0, "0s ago"), (119, "119s ago"), (120, "2m ago"),
                                               (7199, "119m ago"), (7200, "2h ago"), (10799, "2h ago"),
                                               (10800, "3h ago")])
def test_ago(seconds: int, text: str) -> None:
    assert _ago(NOW + seconds, NOW) == text


def judged(history: ServerHistory, probe: ProbeResult | None, facts: BoxFacts = NO_FACTS,
           resolution: Resolution = HERE, now: float = NOW) -> Judgement:
    return judge(S, resolution, probe, history, facts, SETTINGS, now)


def test_reasons_exactly() -> None:
    recovering = ServerHistory(first_seen=NOW - 900, ever_up=True, ok_streak=1, down_since=NOW - 300)
    assert judged(recovering, ProbeResult(ProbeStatus.OK)) == Judgement(
        Verdict.DOWN, "recovering: 1 of 2 good probes in a row needed")
    down = ServerHistory(first_seen=NOW - 900, ever_up=True, fail_streak=3, down_since=NOW - 300)
    assert judged(down, ProbeResult(ProbeStatus.REFUSED, "refused")) == Judgement(
        Verdict.DOWN, "was healthy; down since 5m ago: refused")
    no_since = dataclasses.replace(down, down_since=None)
    assert judged(no_since, ProbeResult(ProbeStatus.REFUSED, "refused")) == Judgement(
        Verdict.DOWN, "was healthy; down: refused")
    assert judged(ServerHistory(first_seen=NOW), None) == Judgement(Verdict.UNKNOWN, "our probe failed: not probed")
    assert judged(ServerHistory(first_seen=NOW), ProbeResult(ProbeStatus.ERROR)) == Judgement(
        Verdict.UNKNOWN, "our probe failed: error")
    noted = Resolution(None, note="vast instance 312 is loading")
    assert judged(ServerHistory(first_seen=NOW), ProbeResult(ProbeStatus.NO_ENDPOINT, "no endpoint"),
                  resolution=noted).reason == "the box never fetched its config; no endpoint (vast instance 312 is loading)"
    assert judged(ServerHistory(first_seen=NOW), ProbeResult(ProbeStatus.REFUSED, "refused"),
                  resolution=noted).reason == "the box never fetched its config; refused"


def test_grace_boundary_and_the_reported_failure() -> None:
    fresh = ServerHistory(first_seen=NOW - 1000)
    at_grace = BoxFacts(fetched_at=NOW - SETTINGS.health_grace_s)
    assert judged(fresh, ProbeResult(ProbeStatus.REFUSED, "refused"), at_grace).verdict is Verdict.STALLED
    report = reported("b" * 40, {"m": S.digest}, NOW, failed={"m"})
    facts = BoxFacts(fetched_at=NOW - 30, report=report)
    reason = judged(fresh, ProbeResult(ProbeStatus.REFUSED, "refused"), facts).reason
    assert reason.endswith("refused; the box reports supervisord gave up on it (it exits while loading: see its log "
                           "on the box)")
    other_digest = BoxFacts(fetched_at=NOW - 30, report=reported("b" * 40, {"m": "sha256:old"}, NOW, failed={"m"}))
    assert judged(fresh, ProbeResult(ProbeStatus.REFUSED, "refused"), other_digest).reason.endswith("refused")
    not_failed = BoxFacts(fetched_at=NOW - 30, report=reported("b" * 40, {"m": S.digest}, NOW))
    assert judged(fresh, ProbeResult(ProbeStatus.REFUSED, "refused"), not_failed).reason.endswith("refused")


def test_stale_reasons_exactly() -> None:
    up = ServerHistory(first_seen=NOW - 900, up=True, ever_up=True)
    assert judged(up, ProbeResult(ProbeStatus.OK, max_model_len=2048)).reason == (
        "serves max_model_len 2048, the repo says 4096: the box must re-fetch and restart vLLM")
    report = reported("c" * 40, {"m": "sha256:old"}, NOW)
    assert judged(up, ProbeResult(ProbeStatus.OK), BoxFacts(fetched_at=NOW, report=report)).reason == (
        f"the box applied revision {'c' * 12} whose boot config for m differs: it must re-fetch and restart vLLM")


def test_rollups_count_by_model_and_by_box() -> None:
    a, b, c = server("127.0.0.2", 8001, "m"), server("127.0.0.2", 8002, "n"), server("127.0.0.3", 8001, "m")
    judgements = {a.key: Judgement(Verdict.HEALTHY, ""), b.key: Judgement(Verdict.DOWN, ""),
                  c.key: Judgement(Verdict.STALE, "")}
    by_model = rollups([a, b, c], judgements, "model")
    assert by_model["m"] == rollup([Verdict.HEALTHY, Verdict.STALE])
    assert by_model["m"].counts == {Verdict.HEALTHY: 1, Verdict.STALE: 1}
    assert (by_model["m"].serving, by_model["m"].total) == (2, 2)
    assert by_model["n"].availability is Availability.UNAVAILABLE
    by_box = rollups([a, b, c], judgements, "box")
    assert list(by_box) == ["127.0.0.2", "127.0.0.3"]
    assert by_box["127.0.0.2"].availability is Availability.DEGRADED
    assert (by_box["127.0.0.2"].serving, by_box["127.0.0.2"].total) == (1, 2)


def test_a_fetch_at_the_instant_it_went_down_is_no_restart() -> None:
    down = ServerHistory(first_seen=NOW - 500, ever_up=True, down_since=NOW - 100, loading_since=NOW - 200)
    assert note_fetch(down, NOW - 100).loading_since == NOW - 200  # not after: the same boot
    assert note_fetch(down, NOW - 99).loading_since == NOW - 99  # after: a restart
    never_loading = dataclasses.replace(down, loading_since=None)
    judgement = judged(never_loading, ProbeResult(ProbeStatus.REFUSED, "refused"), BoxFacts(fetched_at=NOW - 100))
    assert judgement.verdict is Verdict.DOWN  # fetched when it went down, not after: still Down
    later = judged(never_loading, ProbeResult(ProbeStatus.REFUSED, "refused"), BoxFacts(fetched_at=NOW - 99))
    assert later.verdict is Verdict.LOADING  # fetched after going down: a restart, loading again
