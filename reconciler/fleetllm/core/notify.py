"""Outgoing notifications, the pure part: events, whether one is news (deduplication), the JSON payload
every target receives, and its Slack rendering.

An `Event` says that a condition holds (firing) or no longer holds (resolved): a new invalid head of the
tracked branch, a failed or overdue reconcile pass, a model left without a serving server, a halted
rollout. A condition is named by its `key` (kind and subject). What was last sent for each open
condition is a `Condition`, kept in the state store (adapters/state/notifications.py) so that several
replicas and one-off `reconcile --once` runs share it. `decide` says whether an event is news:

- firing, nothing open (or the open one with another fingerprint: a newer invalid head): sent (new,
  changed);
- firing, open with the same fingerprint: sent again only once `renotify_s` has passed (reminder);
- resolved, open: sent once (resolved), and the condition is closed;
- anything else: not sent.

A notice (`NOTICES`: a rollout started, converged, rolled back) is news once: it is kept open in the
ledger like a condition, so that the same notice is never sent twice (no reminder either), and closed
without a word (no resolved notification) once its rollout is no longer the newest.

`settle` turns a snapshot (every condition of one kind that holds now) into decisions, resolving the
open conditions of that kind the snapshot no longer lists. The payload is documented in
docs/notifications.md and schemas/notification.schema.json. No secret is ever put in an event.
"""

from __future__ import annotations

import re
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from fleetllm.core.fleet.jsonvalue import JSON
from fleetllm.core.secret import Secret

PAYLOAD_VERSION = 1
MAX_TEXT = 2000  # characters of one summary or detail string in a payload
MAX_LIST = 20  # items of one detail list in a payload


class EventKind(StrEnum):
    INVALID_COMMIT = "invalid_commit"  # the tracked branch's head is invalid (the last valid one is served)
    PASS_FAILED = "pass_failed"  # noqa: S105 - an event name. The last reconcile pass failed, crashed or is overdue
    MODEL_WITHOUT_SERVERS = "model_without_servers"  # a model has no serving server
    ROLLOUT_HALTED = "rollout_halted"  # a rollout stopped before its end
    ROLLOUT_STARTED = "rollout_started"  # a notice: the rollout of a new revision began
    CONVERGED = "converged"  # a notice: every agent-managed box runs the revision
    ROLLED_BACK = "rolled_back"  # a notice: a rollout halted or was aborted, its boxes rolled back
    CAPACITY_FAILED = "capacity_failed"  # a rental or termination of fleet.yaml's capacity failed (backing off)


# Notices: news once (never a reminder), and closed silently (never resolved) when their rollout is done.
NOTICES = frozenset({EventKind.ROLLOUT_STARTED, EventKind.CONVERGED, EventKind.ROLLED_BACK})

SEVERITY: Mapping[EventKind, str] = {
    EventKind.INVALID_COMMIT: "warning",  # boxes keep the last valid revision
    EventKind.PASS_FAILED: "critical",
    EventKind.MODEL_WITHOUT_SERVERS: "critical",
    EventKind.ROLLOUT_HALTED: "warning",
    EventKind.ROLLOUT_STARTED: "info",
    EventKind.CONVERGED: "info",
    EventKind.ROLLED_BACK: "warning",
    EventKind.CAPACITY_FAILED: "warning",
}

TITLE: Mapping[EventKind, str] = {
    EventKind.INVALID_COMMIT: "Invalid commit",
    EventKind.PASS_FAILED: "Reconcile pass failed",
    EventKind.MODEL_WITHOUT_SERVERS: "Model without servers",
    EventKind.ROLLOUT_HALTED: "Rollout halted",
    EventKind.ROLLOUT_STARTED: "Rollout started",
    EventKind.CONVERGED: "Rollout converged",
    EventKind.ROLLED_BACK: "Rolled back",
    EventKind.CAPACITY_FAILED: "Capacity action failed",
}

RESOLVED_TEXT: Mapping[EventKind, str] = {
    EventKind.INVALID_COMMIT: "the head of {subject} is valid again",
    EventKind.PASS_FAILED: "reconcile passes succeed again ({subject} cleared)",
    EventKind.MODEL_WITHOUT_SERVERS: "model {subject} has a serving server again",
    EventKind.ROLLOUT_HALTED: "rollout {subject} is no longer halted",
    # notices close without a notification; the text is what the ledger's last word would be
    EventKind.ROLLOUT_STARTED: "a newer rollout replaced {subject}",
    EventKind.CONVERGED: "a newer rollout replaced {subject}",
    EventKind.ROLLED_BACK: "a newer rollout replaced {subject}",
    EventKind.CAPACITY_FAILED: "{subject} succeeded, or is no longer planned",
}


class Status(StrEnum):
    FIRING = "firing"
    RESOLVED = "resolved"


class Reason(StrEnum):
    """Why a notification was sent."""

    NEW = "new"  # the condition was not open
    CHANGED = "changed"  # open, but with another fingerprint (a newer invalid head, say)
    REMINDER = "reminder"  # open and unchanged for the re-notify interval
    RESOLVED = "resolved"  # it cleared


@dataclass(frozen=True)
class Event:
    """A condition that holds (`firing`) or cleared. `subject` names what it is about (the branch, the
    model, the rollout; for pass_failed: failed, crashed or overdue); `fingerprint` changes when the
    same condition becomes news again (the SHA of a newer invalid head); `details` is JSON without
    any secret."""

    kind: EventKind
    subject: str
    summary: str
    firing: bool = True
    fingerprint: str = ""
    details: Mapping[str, JSON] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.kind}:{self.subject}"

    @classmethod
    def resolved(cls, kind: EventKind, subject: str, summary: str | None = None) -> Event:
        return cls(kind, subject, summary or RESOLVED_TEXT[kind].format(subject=subject), firing=False)


@dataclass(frozen=True)
class Condition:
    """What was last sent for an open condition (a row of the state store's notification table)."""

    key: str
    kind: str
    subject: str
    fingerprint: str
    summary: str
    first_at: float  # when it was first notified
    sent_at: float  # when it was last notified
    version: int = 0  # bumped by every write: the store's compare-and-swap


@dataclass(frozen=True)
class Decision:
    """A notification to send: `previous` is the open condition it replaces (None: none was open),
    `after` what the store holds once it is sent (None: the condition closes)."""

    event: Event
    reason: Reason
    previous: Condition | None
    after: Condition | None

    @property
    def status(self) -> Status:
        return Status.FIRING if self.event.firing else Status.RESOLVED

    @property
    def started_at(self) -> float:
        return (self.previous or self.after or _never()).first_at


def _never() -> Condition:
    return Condition("", "", "", "", "", 0.0, 0.0)


def decide(open_now: Condition | None, event: Event, now: float, renotify_s: float) -> Decision | None:
    """Whether `event` is news given the condition open for its key (see the module docstring)."""
    if not event.firing:
        if open_now is None:
            return None
        return Decision(event, Reason.RESOLVED, open_now, None)
    if open_now is None:
        return Decision(event, Reason.NEW, None, Condition(event.key, str(event.kind), event.subject,
                                                           event.fingerprint, event.summary, now, now))
    if open_now.fingerprint != event.fingerprint:
        reason = Reason.CHANGED
    elif event.kind in NOTICES:
        return None  # a notice is news once
    elif now - open_now.sent_at >= renotify_s:
        reason = Reason.REMINDER
    else:
        return None
    after = replace(open_now, fingerprint=event.fingerprint, summary=event.summary, sent_at=now,
                    version=open_now.version + 1)
    return Decision(event, reason, open_now, after)


def settle(kind: EventKind, open_now: Mapping[str, Condition], firing: Sequence[Event], now: float,
           renotify_s: float, among: Collection[str] | None = None, keep: Collection[str] = ()) -> list[Decision]:
    """Decisions for a snapshot of `kind`: each firing event decided against its open condition, and
    each open condition of that kind not in the snapshot resolved. `among`: the subjects this snapshot
    speaks for (None: all of that kind), so that two sources of one kind do not resolve each other's;
    `keep`: subjects it cannot tell about this time (a model whose servers could not be observed),
    left as they are."""
    decisions: list[Decision] = []
    listed = set()
    for event in firing:
        if event.kind is not kind:
            raise ValueError(f"a {event.kind} event in a snapshot of {kind}")
        listed.add(event.key)
        decision = decide(open_now.get(event.key), event, now, renotify_s)
        if decision is not None:
            decisions.append(decision)
    for key, condition in sorted(open_now.items()):
        if (condition.kind != kind or key in listed or condition.subject in keep
                or (among is not None and condition.subject not in among)):
            continue
        decisions.append(Decision(Event.resolved(kind, condition.subject), Reason.RESOLVED, condition, None))
    return decisions


# Where notifications go (built by fleetllm.settings from the `notifications:` section).


class TargetKind(StrEnum):
    WEBHOOK = "webhook"  # the JSON payload, POSTed as is
    SLACK = "slack"  # a Slack-compatible incoming webhook: the payload rendered as text blocks
    APPRISE = "apprise"  # any service Apprise speaks to by URL (Teams, Discord, email, ...): a title and a text


@dataclass(frozen=True)
class Target:
    name: str
    kind: TargetKind
    url: Secret  # a Slack webhook or Apprise URL is a secret; a plain webhook URL is wrapped too, never logged
    events: frozenset[EventKind]
    bearer: Secret | None = None  # Authorization: Bearer ...
    header: tuple[str, Secret] | None = None  # one more header carrying a secret (name, value)

    def wants(self, decision: Decision, send_resolved: bool) -> bool:
        kind = decision.event.kind
        return kind in self.events and (decision.event.firing or (send_resolved and kind not in NOTICES))

    def secrets(self) -> tuple[str, ...]:
        """Every secret string this target puts on the wire (scrubbed from any error message)."""
        found = [self.url.reveal()]
        if self.bearer is not None:
            found.append(self.bearer.reveal())
        if self.header is not None:
            found.append(self.header[1].reveal())
        return tuple(s for s in found if s)


# The payload.


def iso(at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))


def _bounded(value: JSON, depth: int = 0) -> JSON:
    if isinstance(value, str):
        return value if len(value) <= MAX_TEXT else value[:MAX_TEXT] + "…"
    if isinstance(value, list):
        return [_bounded(v, depth + 1) for v in value[:MAX_LIST]]
    if isinstance(value, dict):
        return {str(k): _bounded(v, depth + 1) for k, v in list(value.items())[:MAX_LIST]} if depth < 4 else {}
    return value


def payload(decision: Decision, *, now: float, component: str, instance: str) -> dict[str, Any]:
    """The JSON document a webhook target receives (schemas/notification.schema.json)."""
    event = decision.event
    return {
        "version": PAYLOAD_VERSION,
        "kind": str(event.kind),
        "status": str(decision.status),
        "reason": str(decision.reason),
        "key": event.key,
        "subject": event.subject,
        "severity": SEVERITY[event.kind],
        "title": TITLE[event.kind],
        "summary": _bounded(event.summary),
        "fingerprint": event.fingerprint or (decision.previous.fingerprint if decision.previous else ""),
        "started_at": iso(decision.started_at or now),
        "sent_at": iso(now),
        "source": {"component": component, "instance": instance},
        "details": _bounded(dict(event.details)),
    }


# Slack: https://api.slack.com/reference/block-kit/blocks (text at most 3000 characters a section,
# 150 a header, 10 fields of 2000); &, < and > escaped (https://api.slack.com/reference/surfaces/formatting).

_ICON = {("firing", "critical"): ":red_circle:", ("firing", "warning"): ":large_orange_circle:",
         ("firing", "info"): ":large_blue_circle:",
         ("resolved", "critical"): ":large_green_circle:", ("resolved", "warning"): ":large_green_circle:"}


WORD_JOINER = "\u2060"  # invisible, and no receiver reads a mention or a link across it
_MENTION = re.compile(r"@(?=[A-Za-z0-9_.-])")


def slack_escape(text: str) -> str:
    """Text from events (commit subjects, model names, messages) as inert mrkdwn: Slack's `& < >` escapes
    (so no `<!channel>` or `<url|text>`), and for Mattermost-style receivers that read the same payload as
    Markdown, no `@channel`/`@here`/`@user` mention, no `[text](url)` link and no bare URL autolinked: a
    word joiner after `@`, between `](` and after `:` in `://`."""
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    text = _MENTION.sub("@" + WORD_JOINER, text)
    return text.replace("](", "]" + WORD_JOINER + "(").replace("://", ":" + WORD_JOINER + "//")


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _detail_text(value: Any) -> str:
    if isinstance(value, list):
        shown = [_detail_text(v) for v in value[:5]]
        more = f" (+{len(value) - 5} more)" if len(value) > 5 else ""
        return "; ".join(shown) + more
    if isinstance(value, dict):
        return ", ".join(f"{k}={_detail_text(v)}" for k, v in value.items())
    return str(value)


def slack_message(document: Mapping[str, Any]) -> dict[str, Any]:
    """The payload as a Slack incoming-webhook message: `text` (the notification's fallback line) and
    blocks: a header, the summary, the details as fields, and a context line (source and times)."""
    status, severity = str(document["status"]), str(document["severity"])
    word = "RESOLVED" if status == "resolved" else severity.upper()
    head = f"{_ICON.get((status, severity), '')} [{word}] {document['title']}: {document['subject']}".strip()
    summary = slack_escape(str(document["summary"]))
    fields = [{"type": "mrkdwn", "text": _clip(f"*{slack_escape(str(k))}*\n{slack_escape(_detail_text(v))}", 2000)}
              for k, v in list(document["details"].items())[:10]]
    source = document["source"]
    context = (f"fleetllm {slack_escape(str(source['component']))} on {slack_escape(str(source['instance']))}"
               f" · {document['reason']} · since {document['started_at']} · `{slack_escape(str(document['key']))}`")
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": _clip(head, 150), "emoji": True}},
        {"type": "section", "text": {"type": "mrkdwn", "text": _clip(summary, 3000)}},
    ]
    if fields:
        blocks.append({"type": "section", "fields": fields})
    blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": _clip(context, 3000)}]})
    return {"text": _clip(f"{slack_escape(head)}: {summary}", 3000), "blocks": blocks}


# Apprise (https://github.com/caronc/apprise): a title and a plain-text body, which every service it speaks
# to can show; the service's own limits are Apprise's to keep.


def text_message(document: Mapping[str, Any]) -> tuple[str, str]:
    """The payload as a title (`[CRITICAL] Reconcile pass failed: failed`; RESOLVED when it cleared) and a
    plain-text body: the summary, one line per detail, and where it comes from."""
    status, severity = str(document["status"]), str(document["severity"])
    word = "RESOLVED" if status == "resolved" else severity.upper()
    title = _clip(f"[{word}] {document['title']}: {document['subject']}", 250)
    details = "\n".join(f"{k}: {_clip(_detail_text(v), 500)}" for k, v in list(document["details"].items())[:10])
    source = document["source"]
    context = (f"fleetllm {source['component']} on {source['instance']} · {document['reason']} · since "
               f"{document['started_at']} · {document['key']}")
    return title, "\n\n".join(part for part in (str(document["summary"]), details, context) if part)
