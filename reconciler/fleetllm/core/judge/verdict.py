"""The judge: one verdict per intended server, a pure function of (intended, observed, history, now).

Hysteresis lives in `ServerHistory`, advanced once per probe by `advance`: a serving server goes Down
after `down_after_failures` failed probes in a row, or that many failures within the last
2N-1 probes (so a server that answers every other probe does not stay Healthy), and a Down server comes
back only after `up_after_successes` good probes in a row. A server that was never up is Healthy on its
first good probe. Our own failures (a provider listing down, DNS) are Unknown and leave the history
untouched: never counted as healthy, never as down.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from fleetllm.core.fleet.model import ReconcileSettings
from fleetllm.core.judge.intended import IntendedServer, ServerKey
from fleetllm.core.judge.observed import (
    FAILED_PROBES,
    FOREIGN_PROBES,
    BoxFacts,
    ProbeResult,
    ProbeStatus,
    Resolution,
)


class Verdict(StrEnum):
    PENDING = "Pending"  # the box never fetched its config
    LOADING = "Loading"  # fetched, not answering yet, within the grace period
    HEALTHY = "Healthy"  # answers /v1/models with our bearer and the right name
    STALE = "Stale"  # healthy, but running an older boot config: needs a restart
    STALLED = "Stalled"  # past the grace period, never healthy
    DOWN = "Down"  # was healthy, failed N probes
    FOREIGN = "Foreign"  # something answers there, but not with our bearer or not our model
    MISSING = "Missing"  # the provider no longer lists the box
    UNKNOWN = "Unknown"  # our own observation failed


SERVING = frozenset({Verdict.HEALTHY, Verdict.STALE})  # a deployment should exist
NOT_SERVING = frozenset({Verdict.PENDING, Verdict.LOADING, Verdict.STALLED, Verdict.DOWN, Verdict.FOREIGN,
                         Verdict.MISSING})  # a deployment should not exist; Unknown: leave as is


def serving_now(verdict: Verdict, probe: ProbeResult | None) -> bool:
    """The one rule for routing a server that LiteLLM does not route to now (a new server, or one
    released from being held out by a rollout's halt, abort or pause): it serves by its verdict AND a probe
    in this pass succeeded. A server Healthy or Stale only by hysteresis (its probe failed this pass, or it
    was not probed) keeps a deployment it has, but is not given one: it may be crash-looping. The
    deployment planner creates deployments by it, and the rollout step counts a server as up by it."""
    return verdict in SERVING and probe is not None and probe.status is ProbeStatus.OK


@dataclass(frozen=True)
class Judgement:
    verdict: Verdict
    reason: str


@dataclass(frozen=True)
class ServerHistory:
    first_seen: float
    up: bool = False  # currently counted as serving (the hysteresis state)
    ever_up: bool = False
    ok_streak: int = 0
    fail_streak: int = 0
    recent: str = ""  # last probe outcomes, oldest first: "1" good, "0" failed
    last_healthy: float | None = None
    down_since: float | None = None
    loading_since: float | None = None  # the box's config fetch this (not serving) server's load started at


class ProbeOutcome(StrEnum):
    GOOD = "good"
    FAILED = "failed"
    INCONCLUSIVE = "inconclusive"


def outcome_of(resolution: Resolution, probe: ProbeResult | None) -> ProbeOutcome:
    if resolution.unknown is not None:
        return ProbeOutcome.INCONCLUSIVE
    if not resolution.listed:  # a working listing without the box: counts like a failed probe
        return ProbeOutcome.FAILED
    if probe is None or probe.status is ProbeStatus.ERROR:
        return ProbeOutcome.INCONCLUSIVE
    return ProbeOutcome.GOOD if probe.status is ProbeStatus.OK else ProbeOutcome.FAILED


def seeded_history(now: float, serving: bool) -> ServerHistory:
    """A server without history: one that has a managed deployment was judged serving by an earlier
    pass (state lost, or a new store), so it starts up and goes Down only through hysteresis."""
    return ServerHistory(first_seen=now, up=serving, ever_up=serving, last_healthy=now if serving else None)


def advance(history: ServerHistory, outcome: ProbeOutcome, now: float, settings: ReconcileSettings) -> ServerHistory:
    if outcome is ProbeOutcome.INCONCLUSIVE:
        return history
    window = 2 * settings.down_after_failures - 1
    if outcome is ProbeOutcome.GOOD:
        ok = history.ok_streak + 1
        up = history.up or not history.ever_up or ok >= settings.up_after_successes
        return dataclasses.replace(
            history, up=up, ever_up=history.ever_up or up, ok_streak=ok, fail_streak=0,
            recent=(history.recent + "1")[-window:], last_healthy=now,
            down_since=None if up else history.down_since)
    fails = history.fail_streak + 1
    recent = (history.recent + "0")[-window:]
    goes_down = history.up and (fails >= settings.down_after_failures
                                or recent.count("0") >= settings.down_after_failures)
    return dataclasses.replace(
        history, up=history.up and not goes_down, ok_streak=0, fail_streak=fails, recent=recent,
        down_since=now if goes_down else history.down_since)


def note_fetch(history: ServerHistory, fetched_at: float | None) -> ServerHistory:
    """Pin when a server that is not serving started loading: the first config fetch seen for it, or a
    fetch after it went Down (the box restarted). Later fetches do not move it, so a box that keeps
    re-fetching (a crash loop re-provisioning) still reaches Stalled."""
    if history.up or fetched_at is None:
        return dataclasses.replace(history, loading_since=None) if history.loading_since is not None else history
    since = history.loading_since
    restarted = history.down_since is not None and fetched_at > history.down_since and (
        since is None or since <= history.down_since)
    if since is None or restarted:
        return dataclasses.replace(history, loading_since=fetched_at)
    return history


def _ago(now: float, then: float) -> str:
    seconds = max(0, int(now - then))
    if seconds < 120:
        return f"{seconds}s ago"
    return f"{seconds // 60}m ago" if seconds < 7200 else f"{seconds // 3600}h ago"


def _probe_text(probe: ProbeResult | None, resolution: Resolution) -> str:
    if probe is None:
        return "not probed"
    text = probe.detail or str(probe.status)
    return f"{text} ({resolution.note})" if resolution.note and probe.status is ProbeStatus.NO_ENDPOINT else text


def _staleness(server: IntendedServer, probe: ProbeResult, facts: BoxFacts) -> str | None:
    if server.max_model_len is not None and probe.max_model_len not in (None, server.max_model_len):
        return (f"serves max_model_len {probe.max_model_len}, the repo says {server.max_model_len}: "
                "the box must re-fetch and restart vLLM")
    if probe.root is not None and probe.root != server.weights:
        return f"serves weights {probe.root}, the repo says {server.weights}: the box must re-fetch and restart vLLM"
    if (server.gateway_models is not None and probe.gateway_models is not None
            and probe.gateway_models != server.gateway_models):
        return (f"the box gateway routes {probe.gateway_models} model(s), the placement puts "
                f"{server.gateway_models} behind it: the box must re-fetch its config and restart the gateway")
    report = facts.report
    if report is not None:
        applied = report.server_digests().get(server.name)
        if applied is not None and applied != server.digest:
            return (f"the box applied revision {report.revision[:12]} whose boot config for {server.name} differs: "
                    "it must re-fetch and restart vLLM")
    return None


def judge(server: IntendedServer, resolution: Resolution, probe: ProbeResult | None, history: ServerHistory,
          facts: BoxFacts, settings: ReconcileSettings, now: float) -> Judgement:
    """`history` is the history after `advance` with this pass's probe."""
    if resolution.unknown is not None:
        return Judgement(Verdict.UNKNOWN, f"cannot observe the box: {resolution.unknown}")
    if not resolution.listed:
        if history.up:  # one listing without the box is not proof it is gone: the same hysteresis as probes
            return Judgement(Verdict.HEALTHY, f"the {server.provider} listing has no box {server.box}; "
                                              f"{history.fail_streak} pass(es) in a row, Missing after "
                                              f"{settings.down_after_failures}")
        return Judgement(Verdict.MISSING, f"the {server.provider} listing has no box {server.box}")
    if probe is None or probe.status is ProbeStatus.ERROR:
        return Judgement(Verdict.UNKNOWN, f"our probe failed: {_probe_text(probe, resolution)}")
    if probe.status in FOREIGN_PROBES:
        return Judgement(Verdict.FOREIGN, f"something answers at {resolution.endpoint} but not as ours: "
                                          f"{probe.detail}")
    if probe.status is ProbeStatus.OK:
        if not history.up:
            return Judgement(Verdict.DOWN, f"recovering: {history.ok_streak} of {settings.up_after_successes} "
                                           "good probes in a row needed")
        stale = _staleness(server, probe, facts)
        if stale:
            return Judgement(Verdict.STALE, stale)
        return Judgement(Verdict.HEALTHY, f"serves {server.served_model_name} at {resolution.endpoint}")
    assert probe.status in FAILED_PROBES
    detail = _probe_text(probe, resolution)
    if history.up:
        return Judgement(Verdict.HEALTHY, f"{detail}; {history.fail_streak} failed probe(s) in a row, Down after "
                                          f"{settings.down_after_failures}")
    loading = note_fetch(history, facts.fetched_at).loading_since
    refetched = loading is not None and history.down_since is not None and loading > history.down_since
    if history.ever_up and not refetched:
        since = f" since {_ago(now, history.down_since)}" if history.down_since is not None else ""
        return Judgement(Verdict.DOWN, f"was healthy; down{since}: {detail}")
    if loading is None:
        return Judgement(Verdict.PENDING, f"the box never fetched its config; {detail}")
    fetched = loading
    grace = server.health_grace_s
    detail += _reported_failure(server, facts)
    if now - fetched < grace:
        return Judgement(Verdict.LOADING, f"fetched its config {_ago(now, fetched)}, not serving yet "
                                          f"(grace {grace}s): {detail}")
    return Judgement(Verdict.STALLED, f"fetched its config {_ago(now, fetched)}, never healthy within "
                                      f"{grace}s: {detail}")


def _reported_failure(server: IntendedServer, facts: BoxFacts) -> str:
    """What the box said about this server, when it applied this server's boot config and it failed."""
    report = facts.report
    if (report is None or server.name not in report.failed_servers()
            or report.server_digests().get(server.name) != server.digest):
        return ""
    return "; the box reports supervisord gave up on it (it exits while loading: see its log on the box)"


class Availability(StrEnum):
    AVAILABLE = "available"
    DEGRADED = "degraded"
    UNAVAILABLE = "unavailable"


@dataclass(frozen=True)
class Rollup:
    availability: Availability
    counts: Mapping[Verdict, int]
    serving: int
    total: int


def rollup(verdicts: Iterable[Verdict]) -> Rollup:
    """Worst-of: available only when every server serves (an Unknown makes it degraded at best)."""
    counts = Counter(verdicts)
    total = sum(counts.values())
    serving = sum(n for v, n in counts.items() if v in SERVING)
    if serving == 0:
        availability = Availability.UNAVAILABLE
    elif serving < total:
        availability = Availability.DEGRADED
    else:
        availability = Availability.AVAILABLE
    return Rollup(availability, dict(counts), serving, total)


def rollups(servers: Iterable[IntendedServer], judgements: Mapping[ServerKey, Judgement],
            by: str) -> dict[str, Rollup]:
    """Roll-ups per model (`by="model"`) or per box (`by="box"`)."""
    groups: dict[str, list[Verdict]] = {}
    for server in servers:
        group = server.model if by == "model" else server.box
        groups.setdefault(group, []).append(judgements[server.key].verdict)
    return {name: rollup(verdicts) for name, verdicts in sorted(groups.items())}
