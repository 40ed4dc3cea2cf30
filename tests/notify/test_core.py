"""The pure part of notifications: what is news (dedup), snapshots, the payload against its schema,
the Slack rendering, and the events a pass and the control plane derive."""

from __future__ import annotations

import json
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from fleetllm.adapters.state.passes import ActionRecord, PassRecord, ServerRecord
from fleetllm.core.notify import (
    Condition,
    Decision,
    Event,
    EventKind,
    Reason,
    decide,
    payload,
    settle,
    slack_escape,
    slack_message,
)
from fleetllm.job.notify import failed_pass_event, model_events
from fleetllm.server.notifywatch import overdue_event
from tests.conftest import ROOT

SCHEMA = json.loads((ROOT / "schemas" / "notification.schema.json").read_text())
RENOTIFY = 3600.0
MODEL = EventKind.MODEL_WITHOUT_SERVERS


def firing(subject: str = "tiny-a", fingerprint: str = "", kind: EventKind = MODEL) -> Event:
    return Event(kind, subject, f"{subject} has no serving server", fingerprint=fingerprint)


def opened(event: Event, at: float = 100.0, version: int = 0) -> Condition:
    return Condition(event.key, str(event.kind), event.subject, event.fingerprint, event.summary, at, at, version)


def test_a_new_condition_is_sent_once_then_not_until_the_interval() -> None:
    event = firing()
    first = decide(None, event, 100.0, RENOTIFY)
    assert first is not None and first.reason is Reason.NEW and first.after is not None
    assert decide(first.after, event, 100.0 + RENOTIFY - 1, RENOTIFY) is None
    again = decide(first.after, event, 100.0 + RENOTIFY, RENOTIFY)
    assert again is not None and again.reason is Reason.REMINDER
    assert again.after is not None and again.after.first_at == 100.0 and again.after.sent_at == 100.0 + RENOTIFY
    assert again.after.version == first.after.version + 1


def test_a_changed_fingerprint_is_news_at_once() -> None:
    old = firing("main", "a" * 40, EventKind.INVALID_COMMIT)
    newer = firing("main", "b" * 40, EventKind.INVALID_COMMIT)
    decision = decide(opened(old), newer, 101.0, RENOTIFY)
    assert decision is not None and decision.reason is Reason.CHANGED
    assert decide(opened(old), old, 101.0, RENOTIFY) is None


def test_resolved_is_sent_only_for_an_open_condition() -> None:
    event = firing()
    gone = Event.resolved(MODEL, "tiny-a")
    assert decide(None, gone, 200.0, RENOTIFY) is None
    decision = decide(opened(event), gone, 200.0, RENOTIFY)
    assert decision is not None and decision.reason is Reason.RESOLVED and decision.after is None
    assert "tiny-a" in decision.event.summary


def test_settle_resolves_what_the_snapshot_no_longer_lists_within_its_scope() -> None:
    a, b, c = firing("a"), firing("b"), firing("c")
    open_now = {a.key: opened(a), b.key: opened(b), c.key: opened(c)}
    decisions = settle(MODEL, open_now, [a, firing("d")], 150.0, RENOTIFY, keep=("c",))
    assert [(d.event.subject, d.reason) for d in decisions] == [("d", Reason.NEW), ("b", Reason.RESOLVED)]
    scoped = settle(MODEL, open_now, [], 150.0, RENOTIFY, among=("a",))
    assert [(d.event.subject, d.reason) for d in scoped] == [("a", Reason.RESOLVED)]
    with pytest.raises(ValueError, match="snapshot"):
        settle(MODEL, {}, [firing(kind=EventKind.PASS_FAILED)], 1.0, RENOTIFY)


def document(decision: Decision, **details: Any) -> dict[str, Any]:
    return payload(decision, now=1_800_000_000.0, component="control-plane", instance="cp-1")


@pytest.mark.parametrize("kind", list(EventKind))
def test_every_payload_matches_its_schema(kind: EventKind) -> None:
    Draft202012Validator.check_schema(SCHEMA)
    validator = Draft202012Validator(SCHEMA, format_checker=Draft202012Validator.FORMAT_CHECKER)
    event = Event(kind, "x", "something <happened> & more", details={"errors": ["e"] * 50, "long": "y" * 5000})
    fired = decide(None, event, 1_799_999_000.0, RENOTIFY)
    assert fired is not None and fired.after is not None
    resolved = decide(fired.after, Event.resolved(kind, "x"), 1_800_000_000.0, RENOTIFY)
    assert resolved is not None
    for decision in (fired, resolved):
        body = document(decision)
        assert not list(validator.iter_errors(body)), body
        assert body["key"] == f"{kind}:x"
    body = document(fired)
    assert body["status"] == "firing" and body["reason"] == "new" and body["started_at"] == "2027-01-15T07:43:20Z" and body["sent_at"] == "2027-01-15T08:00:00Z"
    assert len(body["details"]["errors"]) == 20 and len(body["details"]["long"]) == 2001
    assert document(resolved)["status"] == "resolved"


def test_slack_rendering_escapes_and_stays_within_slacks_limits() -> None:
    event = Event(EventKind.INVALID_COMMIT, "main", "bad <@U123> & <!channel> " + "z" * 4000,
                  fingerprint="f" * 40, details={f"k{i}": f"<v{i}>" for i in range(15)})
    decision = decide(None, event, 1.0, RENOTIFY)
    assert decision is not None
    message = slack_message(document(decision))
    header, summary, fields, context = message["blocks"]
    assert header["type"] == "header" and len(header["text"]["text"]) <= 150
    assert "[WARNING] Invalid commit: main" in header["text"]["text"]
    assert summary["text"]["type"] == "mrkdwn" and len(summary["text"]["text"]) <= 3000
    assert "<@U123>" not in json.dumps(message["blocks"]) and "&lt;@\u2060U123&gt; &amp; &lt;!channel&gt;" in \
        summary["text"]["text"]
    assert len(fields["fields"]) == 10 and fields["fields"][0]["text"] == "*k0*\n&lt;v0&gt;"
    assert "cp-1" in context["elements"][0]["text"]
    assert len(message["text"]) <= 3000 and "<@U123>" not in message["text"] and "&lt;@\u2060U123&gt;" in message["text"]
    resolved = decide(decision.after, Event.resolved(EventKind.INVALID_COMMIT, "main"), 2.0, RENOTIFY)
    assert resolved is not None
    assert "[RESOLVED] Invalid commit: main" in slack_message(document(resolved))["text"]
    assert slack_escape("a<b>&c") == "a&lt;b&gt;&amp;c"


def test_slack_text_has_no_mention_or_link_a_markdown_receiver_would_act_on() -> None:
    """Mattermost-style receivers read the Slack payload as Markdown: `@channel`, `@here`, `[x](url)` and a bare
    URL from a commit subject must arrive inert."""
    hostile = "fix @channel @here @all ping @ops see [docs](https://evil.example/x) or http://evil.example"
    event = Event(EventKind.INVALID_COMMIT, "main @here", hostile, fingerprint="f" * 40, details={"@channel": hostile})
    decision = decide(None, event, 1.0, RENOTIFY)
    assert decision is not None
    message = slack_message(document(decision))
    shown = [message["text"], *(json.loads(json.dumps(b)) for b in message["blocks"][1:])]
    text = json.dumps(shown, ensure_ascii=False)
    for live in ("@channel", "@here", "@all", "@ops", "](", "://"):
        assert live not in text, live
    assert "docs" in text and "evil.example" in text  # still readable


def server(model: str, verdict: str, port: int = 8001, paused: bool = False) -> ServerRecord:
    return ServerRecord("127.0.0.2", port, f"s{port}", model, verdict, "why", paused=paused)


def test_models_without_a_serving_server() -> None:
    record = PassRecord(1.0, 0.1, "r" * 40, "apply", {"Healthy": 1}, servers=(
        server("ok", "Healthy"), server("ok", "Down", 8002),
        server("gone", "Down"), server("gone", "Pending", 8002),
        server("unknown", "Unknown"), server("loading", "Loading"),
        server("paused", "Down", paused=True), server("stale", "Stale")))
    firing_events, undecided = model_events(record)
    assert [e.subject for e in firing_events] == ["gone"]
    assert undecided == {"unknown", "loading"}
    assert firing_events[0].details["servers"][0]["verdict"] == "Down"  # type: ignore[index]


def test_a_failed_pass_and_an_ok_one() -> None:
    ok = PassRecord(1.0, 0.1, "r" * 40, "apply", {})
    assert failed_pass_event(ok) is None
    failed = PassRecord(1.0, 0.1, "r" * 40, "apply", {}, (ActionRecord("create", "fleetllm:b:1", False, "failed",
                                                                       "HTTP 500"),), ("litellm: refused",))
    event = failed_pass_event(failed)
    assert event is not None and event.subject == "failed"
    assert "1 observation error(s), 1 failed LiteLLM write(s); first: litellm: refused" in event.summary


def test_an_overdue_pass() -> None:
    assert overdue_event(1000.0, 0.0, 1000.0 + 180.0, 60) is None  # 2 intervals and a minute
    late = overdue_event(1000.0, 0.0, 1000.0 + 181.0, 60)
    assert late is not None and late.subject == "overdue" and "181 s ago" in late.summary
    never = overdue_event(None, 500.0, 500.0 + 200.0, 60)
    assert never is not None and "no reconcile pass recorded" in never.summary
