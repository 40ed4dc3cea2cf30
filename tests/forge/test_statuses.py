"""Commit statuses: what each rollout transition sets (fleetllm.core.forge), and the forge adapter
(fleetllm.adapters.forge) against the fake GitHub process (tests/support/fake_forge.py), which holds every
request and answer to GitHub's published OpenAPI description: what is sent, in order, with which
headers; retried on 5xx, 429 and a rate-limited 403, not on 4xx; a redirect never followed with the
token; never blocking the caller; the token in no log line."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from fleetllm.adapters.forge import CommitStatuses
from fleetllm.adapters.http import RetryPolicy
from fleetllm.adapters.state.passes import PassRecord, RolloutPassRecord
from fleetllm.core.forge import MAX_DESCRIPTION, CommitStatus, ForgeConfig, StatusState, clip, commit_status
from fleetllm.core.rollout.transitions import RolloutChange, Transition
from fleetllm.core.secret import Secret
from fleetllm.job.forge import pass_statuses, post_statuses
from tests.server.conftest import LogCapture
from tests.support.fake_forge import ForgeProcess, fake_forge

SHA1, SHA2 = "a1" * 20, "b2" * 20
LINK = "https://fleet.example.org"
FAST = RetryPolicy(attempts=1, base_delay_s=0.01, factor=1.0, max_delay_s=0.05)
HALT = ("box 127.0.0.3: server(s) qwen3-8b-8001 crash-loop (the box reports them failed); rolled back to "
        "5c1d0e9a2b44")


def change(transition: Transition, reason: str = "", target: str = SHA1, by: str = "") -> RolloutChange:
    return RolloutChange(target, transition, 50.0, reason, waves=2, by=by, started_at=10.0)


# -- what each transition sets (pure) ------------------------------------------------------------------
@pytest.mark.parametrize(("transition", "state"), [
    (Transition.STARTED, "pending"), (Transition.PAUSED, "pending"), (Transition.RESUMED, "pending"),
    (Transition.CONVERGED, "success"), (Transition.HALTED, "failure"), (Transition.ABORTED, "failure"),
    (Transition.SUPERSEDED, "error")])
def test_each_transition_sets_its_state_with_a_link_to_the_revision_page(transition: Transition, state: str) -> None:
    status = commit_status(change(transition, "aborted by admin:ops", by=SHA2), "fleetllm/rollout", LINK + "/")
    assert (status.sha, str(status.state), status.context) == (SHA1, state, "fleetllm/rollout")
    assert status.target_url == "https://fleet.example.org/revision#rollout"
    assert 0 < len(status.description) <= MAX_DESCRIPTION


def test_the_description_says_why_within_140_characters() -> None:
    halted = commit_status(change(Transition.HALTED, HALT), "c", None)
    assert halted.description == f"Halted: {HALT}" and halted.target_url is None
    assert "target_url" not in halted.body()
    long = commit_status(change(Transition.HALTED, "box x: " + "very " * 60 + "long"), "c", LINK)
    assert len(long.description) == MAX_DESCRIPTION and long.description.endswith("…")
    assert clip("two\nlines  and\tspaces") == "two lines and spaces"
    assert "by admin:ops" in commit_status(change(Transition.ABORTED, "aborted by admin:ops"), "c", None).description
    assert SHA2[:12] in commit_status(change(Transition.SUPERSEDED, by=SHA2), "c", None).description
    assert "2 waves" in commit_status(change(Transition.CONVERGED), "c", None).description


def test_a_pass_sets_a_status_per_transition_in_order() -> None:
    record = PassRecord(1.0, 1.0, SHA2, "apply", {}, rollout=RolloutPassRecord(SHA2, "running", changes=(
        change(Transition.SUPERSEDED, by=SHA2), change(Transition.STARTED, target=SHA2))))
    statuses = pass_statuses(record, config("http://127.0.0.1:9", "t"))
    assert [(s.sha, str(s.state)) for s in statuses] == [(SHA1, "error"), (SHA2, "pending")]
    assert pass_statuses(PassRecord(1.0, 1.0, SHA2, "apply", {}), config("http://127.0.0.1:9", "t")) == []


# -- the adapter against the fake ------------------------------------------------------------------------
def config(url: str, token: str, repository: str = "fleet-org/fleet", attempts: int = 3) -> ForgeConfig:
    return ForgeConfig(kind="github", api_url=url, repository=repository, token=Secret(token, "${env:GITHUB_TOKEN}"),
                       context="fleetllm/rollout", control_plane_url=LINK, timeout_s=5.0, attempts=attempts,
                       drain_timeout_s=10.0)


@pytest.fixture
def forge(tmp_path: Path) -> Iterator[ForgeProcess]:
    with fake_forge(tmp_path / "forge") as process:
        yield process


@pytest.fixture
def logs() -> Iterator[LogCapture]:
    import logging

    from fleetllm.logs import setup_logging

    capture = LogCapture()
    setup_logging(capture.stream, logging.INFO)
    yield capture
    setup_logging()


def sender(forge: ForgeProcess, **kw: object) -> CommitStatuses:
    token = str(kw.pop("token", forge.token))
    return CommitStatuses(config(forge.url, token, **kw), backoff=FAST)  # type: ignore[arg-type]


def status(state: StatusState, sha: str = SHA1, description: str = "Rolling out") -> CommitStatus:
    return CommitStatus(sha, state, description, "fleetllm/rollout", LINK + "/revision#rollout")


def test_statuses_reach_the_forge_in_order_with_githubs_headers(forge: ForgeProcess, logs: LogCapture) -> None:
    statuses = sender(forge)
    record = PassRecord(1.0, 1.0, SHA1, "apply", {}, rollout=RolloutPassRecord(SHA1, "converged", changes=(
        change(Transition.STARTED), change(Transition.CONVERGED))))
    post_statuses(statuses, record)
    post_statuses(statuses, PassRecord(2.0, 1.0, SHA2, "apply", {}, rollout=RolloutPassRecord(SHA2, "halted", changes=(
        change(Transition.STARTED, target=SHA2), change(Transition.HALTED, HALT, target=SHA2)))))
    assert statuses.close(30)
    assert forge.states(SHA1) == [("pending", "Rolling out: agent-managed boxes move to it in waves"),
                                  ("success", "Converged: every agent-managed box runs it (2 waves)")]
    assert forge.states(SHA2)[-1] == ("failure", f"Halted: {HALT}")
    newest = forge.statuses(SHA1)[0]
    assert (newest["context"], newest["target_url"]) == ("fleetllm/rollout", LINK + "/revision#rollout")
    state = forge.state()
    posted = [r for r in state["requests"] if r["method"] == "POST"]
    assert len(posted) == 4 and all(r["authorized"] for r in posted)
    assert {(r["accept"], r["api_version"], r["user_agent"]) for r in posted} == {
        ("application/vnd.github+json", "2022-11-28", "fleetllm-forge")}
    assert state["violations"] == []
    assert statuses.metrics.sent.labels("pending")._value.get() == 2
    assert [e["state"] for e in logs.events("commit status set")] == ["pending", "success", "pending", "failure"]
    assert forge.token not in logs.text


def test_a_503_a_429_and_a_rate_limited_403_are_retried_after_what_they_ask(forge: ForgeProcess,
                                                                           logs: LogCapture) -> None:
    forge.fault(503)
    forge.fault(429, retry_after="0")
    forge.fault(403, retry_after="0", message="You have exceeded a secondary rate limit")
    statuses = sender(forge, attempts=4)
    statuses.post(status(StatusState.PENDING))
    assert statuses.close(30)
    assert forge.states(SHA1) == [("pending", "Rolling out")]
    assert [e["http_status"] for e in logs.events("commit status retried")] == [503, 429, 403]
    assert forge.violations() == []


@pytest.mark.parametrize(("fault", "hint"), [(404, "forge.repository is not found"),
                                             (422, "a commit it does not have"),
                                             (403, "may not write commit statuses")])
def test_another_4xx_is_final_and_says_what_to_do(forge: ForgeProcess, logs: LogCapture, fault: int,
                                                  hint: str) -> None:
    forge.fault(fault, message="Resource not accessible by integration" if fault == 403 else None)
    statuses = sender(forge)
    statuses.post(status(StatusState.SUCCESS))
    assert statuses.close(30)
    [failed] = logs.events("commit status not set")
    assert failed["http_status"] == fault and failed["attempts"] == 1 and hint in failed["hint"]
    assert forge.statuses(SHA1) == [] and statuses.metrics.failed.labels("success")._value.get() == 1


def test_the_fake_holds_requests_to_the_published_description(forge: ForgeProcess) -> None:
    """Not a vacuous check: a body the description refuses (an unknown state, a context that is not a
    string) is answered 422 and kept as a violation."""
    for body in ({"state": "done"}, {"state": "success", "context": 7}, {"description": "no state"}):
        answer, error = forge._call("POST", f"/repos/fleet-org/fleet/statuses/{SHA1}", body, token=forge.token)
        assert answer == 422 and error["message"].startswith("Invalid request"), error
    assert len(forge.violations()) == 3 and all(v.startswith("request POST") for v in forge.violations())


def test_the_fakes_own_refusals_are_githubs(forge: ForgeProcess, logs: LogCapture) -> None:
    """A wrong token (401), another repository (404), a description over 140 characters (422)."""
    wrong = sender(forge, token="ghp_notTheRightOne")
    wrong.post(status(StatusState.PENDING))
    assert wrong.close(30)
    elsewhere = sender(forge, repository="someone/else")
    elsewhere.post(status(StatusState.PENDING))
    assert elsewhere.close(30)
    long = sender(forge)
    long.post(status(StatusState.PENDING, description="x" * 141))  # the core clips; the fake refuses as GitHub does
    assert long.close(30)
    assert [e["http_status"] for e in logs.events("commit status not set")] == [401, 404, 422]
    assert forge.statuses(SHA1) == [] and forge.violations() == []
    assert "ghp_notTheRightOne" not in logs.text and forge.token not in logs.text


def test_a_redirect_is_never_followed_with_the_token(tmp_path: Path, forge: ForgeProcess, logs: LogCapture) -> None:
    with fake_forge(tmp_path / "elsewhere", token=forge.token) as elsewhere:
        forge.fault(307, location=f"{elsewhere.url}/repos/fleet-org/fleet/statuses/{SHA1}")
        statuses = sender(forge)
        statuses.post(status(StatusState.PENDING))
        assert statuses.close(30)
        assert elsewhere.state()["requests"] == []  # the token went nowhere else
    [failed] = logs.events("commit status not set")
    assert failed["http_status"] == 307 and "forge.api_url" in failed["hint"]


def test_post_never_waits_on_a_forge_that_does_not_answer(logs: LogCapture) -> None:
    """The forge takes the connection and never answers (a listening socket nobody accepts on): every post
    returns with nothing answered, a full queue drops its oldest, and close gives up at its drain time."""
    import socket

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        port = silent.getsockname()[1]
        statuses = CommitStatuses(replace(config(f"http://127.0.0.1:{port}", "ghp_x", attempts=1), timeout_s=60.0),
                                  backoff=FAST, queue_size=3)
        for i in range(6):
            statuses.post(status(StatusState.PENDING, sha=f"{i:040d}"))
        assert statuses.metrics.sent.labels("pending")._value.get() == 0  # nothing was answered
        assert statuses.metrics.failed.labels("pending")._value.get() == 0
        assert statuses.metrics.dropped._value.get() >= 2  # 6 posts, 3 queued, at most one taken in flight
        assert statuses.close(0.2) is False  # still waiting at exit: given up, and said so
    assert logs.events("commit statuses not sent before exit")
