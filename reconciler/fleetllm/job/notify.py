"""What a reconcile pass notifies (fleetllm.core.notify): a failed or crashed pass, and each model left
without a serving server (the notifier is built from the settings: fleetllm.settings.make_notifier).

`pass_failed`: the pass recorded observation errors or failed LiteLLM writes (subject `failed`), or
raised (subject `crashed`); both resolve at the next pass that completes without error.
`model_without_servers`: every server of the model that is not paused was judged, and none of them
serves (Healthy or Stale); a model whose servers are all Unknown (our own observation failed) or still
Loading (within the grace period) is left as it was; a model that serves again, or left the fleet,
resolves.
"""

from __future__ import annotations

from collections import defaultdict

from fleetllm.adapters.notify import Notifier
from fleetllm.adapters.state.passes import PassRecord, ServerRecord
from fleetllm.core.fleet.jsonvalue import JSON
from fleetllm.core.judge.verdict import SERVING, Verdict
from fleetllm.core.notify import Event, EventKind
from fleetllm.core.rollout.model import RolloutState

UNDECIDED = frozenset({str(Verdict.UNKNOWN), str(Verdict.LOADING)})
SERVING_NAMES = frozenset(str(v) for v in SERVING)
PASS_SUBJECTS = ("failed", "crashed")
MAX_ERRORS = 10


def failed_pass_event(record: PassRecord) -> Event | None:
    if record.ok:
        return None
    failed = [a for a in record.actions if not a.ok]
    details: dict[str, JSON] = {
        "revision": record.revision, "mode": record.mode, "started_at": record.started_at,
        "errors": list(record.errors[:MAX_ERRORS]),
        "failed_actions": [{"kind": a.kind, "id": a.id, "error": a.error} for a in failed[:MAX_ERRORS]]}
    return Event(EventKind.PASS_FAILED, "failed",
                 f"the reconcile pass at {record.revision[:12]} failed: {len(record.errors)} observation error(s), "
                 f"{len(failed)} failed LiteLLM write(s)" + (f"; first: {record.errors[0]}" if record.errors else ""),
                 details=details)


def crashed_pass_event(error: str) -> Event:
    return Event(EventKind.PASS_FAILED, "crashed", f"a reconcile pass did not complete: {error}",
                 details={"error": error})


def _server(s: ServerRecord) -> dict[str, JSON]:
    return {"box": s.box, "port": s.port, "name": s.name, "verdict": s.verdict, "reason": s.reason}


def model_events(record: PassRecord) -> tuple[list[Event], set[str]]:
    """(the models without a serving server, the models this pass cannot tell about)."""
    by_model: dict[str, list[ServerRecord]] = defaultdict(list)
    for server in record.servers:
        if not server.paused:
            by_model[server.model].append(server)
    firing: list[Event] = []
    undecided: set[str] = set()
    for model, servers in sorted(by_model.items()):
        if any(s.verdict in SERVING_NAMES for s in servers):
            continue
        if all(s.verdict in UNDECIDED for s in servers):
            undecided.add(model)
            continue
        verdicts = ", ".join(f"{s.box}:{s.port} {s.verdict}" for s in servers[:5])
        more = f" (+{len(servers) - 5} more)" if len(servers) > 5 else ""
        firing.append(Event(EventKind.MODEL_WITHOUT_SERVERS, model,
                            f"model {model} has no serving server: {verdicts}{more}",
                            details={"model": model, "revision": record.revision,
                                     "servers": [_server(s) for s in servers[:20]]}))
    return firing, undecided


def notify_pass(notifier: Notifier, record: PassRecord) -> None:
    """After a recorded pass: its failure (or its success, which resolves), and each model's serving state."""
    failed = failed_pass_event(record)
    notifier.settle(EventKind.PASS_FAILED, [failed] if failed else [], among=PASS_SUBJECTS)
    if record.detailed or not record.verdicts:  # a summary-only record tells nothing about each model
        firing, undecided = model_events(record)
        notifier.settle(EventKind.MODEL_WITHOUT_SERVERS, firing, keep=undecided)
    if record.rollout is not None:
        halted = rollout_event(record)
        notifier.settle(EventKind.ROLLOUT_HALTED, [halted] if halted else [])


def rollout_event(record: PassRecord) -> Event | None:
    """The rollout is halted (a released box failed and was rolled back): firing until a new commit
    starts a new rollout or a person resumes it; the subject is the target revision."""
    rollout = record.rollout
    if rollout is None or rollout.state != str(RolloutState.HALTED):
        return None
    back = dict(rollout.rollbacks)
    return Event(EventKind.ROLLOUT_HALTED, rollout.target,
                 f"the rollout of {rollout.target[:12]} halted: {rollout.halt or rollout.reason}",
                 details={"target": rollout.target, "reason": rollout.halt or rollout.reason, "waves": rollout.waves,
                          "rolled_back": dict(sorted(back.items()))})


def notify_crash(notifier: Notifier, exc: BaseException) -> None:
    notifier.emit(crashed_pass_event(f"{type(exc).__name__}: {exc}"[:500]))


__all__ = ["model_events", "notify_crash", "notify_pass", "rollout_event"]
