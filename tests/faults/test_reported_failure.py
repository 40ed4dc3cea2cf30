"""The judge tells a server the box reports as given up by supervisord (for the boot config it runs),
and only then: a report about an older boot config says nothing about this one."""

from __future__ import annotations

from fleetllm.core.boxreport import BoxReport
from fleetllm.core.judge.intended import Endpoint
from fleetllm.core.judge.observed import BoxFacts, ProbeStatus, Resolution
from fleetllm.core.judge.verdict import ServerHistory, Verdict, judge
from tests.reconcile.builders import NOW, SETTINGS, failed, reported, server

S = server("127.0.0.2", 8001, "m")
HERE = Resolution(Endpoint("127.0.0.2", 8001))


def reason(report: BoxReport | None, fetched_ago: float) -> tuple[Verdict, str]:
    history = ServerHistory(first_seen=NOW - fetched_ago)
    facts = BoxFacts(fetched_at=NOW - fetched_ago, report=report)
    judgement = judge(S, HERE, failed(ProbeStatus.REFUSED), history, facts, SETTINGS, NOW)
    return judgement.verdict, judgement.reason


def test_a_reported_give_up_is_in_the_reason() -> None:
    given_up = reported("a" * 40, {S.name: S.digest}, NOW - 30, failed={S.name})
    assert reason(given_up, 3600) == (Verdict.STALLED, reason(None, 3600)[1]
                                      + "; the box reports supervisord gave up on it (it exits while loading: "
                                        "see its log on the box)")
    verdict, text = reason(given_up, 60)
    assert verdict is Verdict.LOADING and "supervisord gave up on it" in text


def test_a_report_for_another_boot_config_or_server_says_nothing() -> None:
    older = reported("b" * 40, {S.name: "sha256:older"}, NOW - 30, failed={S.name})
    other = reported("a" * 40, {S.name: S.digest}, NOW - 30, failed={"other"})
    assert "gave up" not in reason(older, 3600)[1]
    assert "gave up" not in reason(other, 3600)[1]
