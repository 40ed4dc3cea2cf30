"""The fleet and models views: per box and server, what the repository says (the served revision)
joined with what the control plane recorded (config fetches, reports) and what the last reconcile pass
judged. Pure functions of `Inputs`; the JSON API is these dataclasses as they are (`asdict`)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from fleetllm.adapters.state.passes import PassRecord, ServerRecord
from fleetllm.core.boxreport import BoxReport
from fleetllm.core.fleet.jsonvalue import thaw
from fleetllm.core.fleet.model import Box, Fleet, Provider
from fleetllm.core.judge.verdict import SERVING, Verdict, rollup
from fleetllm.errors import RequestError
from fleetllm.server.pages.inputs import Inputs
from fleetllm.server.reports import staleness
from fleetllm_contract.report import ReportOutcome

NOT_JUDGED = "not judged yet"
NOT_JUDGED_COUNT = "Not judged"  # the key counting them among the verdicts
SHOW = ("all", "problems")  # the fleet filter's choices
MAX_QUERY = 200
# how verdict counts are listed: serving first, then on the way, then failing
COUNT_ORDER = {name: i for i, name in enumerate((
    Verdict.HEALTHY, Verdict.STALE, Verdict.LOADING, Verdict.PENDING, Verdict.STALLED, Verdict.DOWN, Verdict.FOREIGN,
    Verdict.MISSING, Verdict.UNKNOWN, NOT_JUDGED_COUNT))}


def ordered(counts: Mapping[str, int]) -> dict[str, int]:
    return dict(sorted(counts.items(), key=lambda item: (COUNT_ORDER.get(item[0], 99), item[0])))


def ordered_counts(names: Iterable[str]) -> dict[str, int]:
    return ordered(Counter(names))


@dataclass(frozen=True)
class PassInfo:
    """Which pass the verdicts come from."""

    started_at: float
    age_s: float
    revision: str
    mode: str
    ok: bool
    invalid_head: str | None = None  # the branch head it could not use (not valid): it ran on `revision`


@dataclass(frozen=True)
class ServerView:
    name: str
    model: str
    listen_port: int
    gateway_port: int | None  # the box gateway's port the server is reached through
    public: str | None  # host:port dialled, from the last pass
    verdict: str | None  # None: no pass judged this server yet
    reason: str
    max_model_len: int | None  # what the repository asks for
    served_max_model_len: int | None  # what the server reported
    deployment: bool | None  # a managed LiteLLM deployment exists (None: unknown)
    paused: bool


@dataclass(frozen=True)
class Fit:
    state: str  # "ok" | "failed" | "install-failed" | "dry-run" | "unknown"
    text: str
    problems: tuple[str, ...] = ()


@dataclass(frozen=True)
class BoxView:
    name: str
    provider: str
    address: str | None
    availability: str
    last_fetch_at: float | None
    last_fetch_age_s: float | None
    fetched_revision: str | None  # the revision its last config fetch was answered with
    reported_revision: str | None  # the revision it says it applied
    reported_at: float | None
    report_outcome: str | None  # installed | fit_failed | failed | dry_run
    boot_config: str  # "current" | "stale" | "not-applied" | "unknown": what it applied vs the served revision
    fit: Fit
    render_error: str | None
    servers: tuple[ServerView, ...]
    cost_per_hour: float | None = None  # USD, from its provider's listing at the last pass; None: unpriced
    rented: str | None = None  # what is rented: "1 × H100 80GB on RunPod"


@dataclass(frozen=True)
class FleetView:
    generated_at: float
    revision: str | None
    last_pass: PassInfo | None
    verdicts: Mapping[str, int]  # over the whole fleet, whatever the filter lists
    boxes: tuple[BoxView, ...]  # the boxes the filter keeps
    total_boxes: int
    show: str
    q: str
    cost_per_hour: float | None = None  # the priced boxes' sum at the last pass (None: no pass priced any)
    unpriced: tuple[str, ...] = ()  # rented boxes whose price the last pass could not read


class FilterError(RequestError, ValueError):
    """A fleet filter (?show=, ?q=) the pages cannot apply; the message says which and why."""


@dataclass(frozen=True)
class FleetFilter:
    """Which boxes the fleet page and /api/fleet list. `show=problems` keeps a box when a server on it
    is anything but Healthy (or not judged yet; paused servers aside), it does not fit or failed to
    install, it runs a config older than the served one, or it cannot be given its config. `q` keeps a
    box when its name, a server's name or a server's model contains it, ignoring case."""

    show: str = "all"
    q: str = ""

    @classmethod
    def parse(cls, args: Mapping[str, str]) -> FleetFilter:
        show, q = args.get("show", "all"), args.get("q", "").strip()
        if show not in SHOW:
            raise FilterError(f"show must be one of {', '.join(SHOW)}, not {show[:40]!r}")
        if len(q) > MAX_QUERY:
            raise FilterError(f"q is longer than {MAX_QUERY} characters")
        return cls(show, q)

    def keeps(self, box: BoxView) -> bool:
        if self.show == "problems" and not needs_attention(box):
            return False
        needle = self.q.casefold()
        names = (box.name, *(s.name for s in box.servers), *(s.model for s in box.servers))
        return not needle or any(needle in name.casefold() for name in names)


def needs_attention(box: BoxView) -> bool:
    return (box.render_error is not None or box.fit.state in ("failed", "install-failed")
            or box.boot_config == "stale" or any(s.verdict != Verdict.HEALTHY for s in box.servers if not s.paused))


@dataclass(frozen=True)
class ModelView:
    name: str
    availability: str
    serving: int
    total: int
    deployments: tuple[str, ...]  # box:port of the servers that serve with a deployment
    min_context: int | None  # smallest max_model_len among the serving servers
    verdicts: Mapping[str, int]
    cost_per_hour: float | None = None  # its share of its boxes' price (fleetllm.core.cost), last pass


@dataclass(frozen=True)
class ModelsView:
    generated_at: float
    revision: str | None
    last_pass: PassInfo | None
    models: tuple[ModelView, ...]
    cost_per_hour: float | None = None  # the fleet's, as on the fleet page


def pass_info(record: PassRecord | None, now: float) -> PassInfo | None:
    if record is None:
        return None
    return PassInfo(record.started_at, round(max(0.0, now - record.started_at), 1), record.revision, record.mode,
                    record.ok, None if record.head_valid else record.head)


def judged_servers(record: PassRecord | None) -> dict[tuple[str, int], ServerRecord]:
    return {(s.box, s.port): s for s in record.servers} if record is not None else {}


def server_views(fleet: Fleet, box: Box, judged: Mapping[tuple[str, int], ServerRecord]) -> tuple[ServerView, ...]:
    views = []
    for row in box.servers:
        recipe = fleet.recipes[row.model]
        seen = judged.get((box.name, row.port))
        if seen is not None and (seen.model, seen.name) != (row.model, row.name):
            seen = None  # the pass judged what an older revision had on this port
        views.append(ServerView(
            name=row.name, model=row.model, listen_port=row.port, gateway_port=box.gateway_port,
            public=seen.endpoint if seen else None, verdict=seen.verdict if seen else None,
            reason=seen.reason if seen else NOT_JUDGED, max_model_len=recipe.vllm.max_model_len,
            served_max_model_len=seen.served_max_model_len if seen else None,
            deployment=seen.deployment if seen else None, paused=seen.paused if seen else False))
    return tuple(views)


def fit_of(report: BoxReport | None) -> Fit:
    if report is None:
        return Fit("unknown", "no report from the box yet")
    fit = thaw(report.body.get("fit"))
    listed = fit.get("problems") if isinstance(fit, dict) else None
    problems = tuple(str(p) for p in listed) if isinstance(listed, list) else ()
    message = report.body.get("message")
    if report.outcome is ReportOutcome.FIT_FAILED or (isinstance(fit, dict) and fit.get("ok") is False):
        return Fit("failed", "does not fit: " + ("; ".join(problems) or str(message or "see the box's log")),
                   problems)
    if report.outcome is ReportOutcome.FAILED:
        return Fit("install-failed", f"install failed: {message or 'see the box log'}", problems)
    if report.outcome is ReportOutcome.DRY_RUN:
        return Fit("dry-run", "dry run: checked, nothing installed", problems)
    return Fit("ok", "fits", problems)


def _availability(servers: tuple[ServerView, ...]) -> str:
    return str(rollup(Verdict(s.verdict) if s.verdict else Verdict.UNKNOWN for s in servers).availability)


def box_view(inputs: Inputs, fleet: Fleet, box: Box, judged: Mapping[tuple[str, int], ServerRecord]) -> BoxView:
    servers = server_views(fleet, box, judged)
    hosts = sorted({s.public.rsplit(":", 1)[0] for s in servers if s.public})
    provider = box.rented_from
    address = ", ".join(hosts) if hosts else (box.name if provider is Provider.STATIC else None)
    fetch = inputs.fetches.get(box.name)
    report = inputs.reports.get(box.name)
    rendered = inputs.served.boxes.get(box.name) if inputs.served is not None else None
    boot = "unknown"
    if report is not None and rendered is not None:
        boot = "not-applied" if report.outcome is not ReportOutcome.INSTALLED else \
            "stale" if staleness(report, json.loads(rendered.body))["stale"] else "current"
    render_error = inputs.served.render_errors.get(box.name) if inputs.served is not None else None
    cost = inputs.last_pass.cost if inputs.last_pass is not None else None
    return BoxView(
        name=box.name, provider=str(provider), address=address, availability=_availability(servers),
        last_fetch_at=fetch.at if fetch else None,
        last_fetch_age_s=round(max(0.0, inputs.now - fetch.at), 1) if fetch else None,
        fetched_revision=fetch.revision if fetch else None,
        reported_revision=report.revision if report else None, reported_at=report.received_at if report else None,
        report_outcome=str(report.outcome) if report else None, boot_config=boot, fit=fit_of(report),
        render_error=render_error, servers=servers,
        cost_per_hour=cost.boxes.get(box.name) if cost is not None else None,
        rented=cost.what.get(box.name) if cost is not None else None)


def fleet_view(inputs: Inputs, listed: FleetFilter = FleetFilter()) -> FleetView:
    served = inputs.served
    judged = judged_servers(inputs.last_pass)
    boxes = tuple(box_view(inputs, served.fleet, box, judged) for _, box in sorted(served.fleet.boxes.items())) \
        if served is not None else ()
    counts = ordered_counts(s.verdict or NOT_JUDGED_COUNT for b in boxes for s in b.servers)
    cost = inputs.last_pass.cost if inputs.last_pass is not None else None
    return FleetView(inputs.now, served.revision if served else None, pass_info(inputs.last_pass, inputs.now),
                     counts, tuple(b for b in boxes if listed.keeps(b)), len(boxes), listed.show, listed.q,
                     cost.total if cost is not None else None, cost.unpriced if cost is not None else ())


def models_view(inputs: Inputs) -> ModelsView:
    served = inputs.served
    models: list[ModelView] = []
    cost = inputs.last_pass.cost if inputs.last_pass is not None else None
    if served is not None:
        judged = judged_servers(inputs.last_pass)
        fleet = served.fleet
        placed = [(box.name, s) for _, box in sorted(fleet.boxes.items()) for s in server_views(fleet, box, judged)]
        for name in sorted(fleet.recipes):
            pool = [(box, s) for box, s in placed if s.model == name]
            verdicts = [Verdict(s.verdict) if s.verdict else Verdict.UNKNOWN for _, s in pool]
            summary = rollup(verdicts)
            serving = [(box, s) for (box, s), v in zip(pool, verdicts, strict=True) if v in SERVING]
            contexts = [c for _, s in serving if (c := s.served_max_model_len or s.max_model_len) is not None]
            models.append(ModelView(
                name=name, availability=str(summary.availability), serving=summary.serving, total=summary.total,
                deployments=tuple(f"{box}:{s.listen_port}" for box, s in serving if s.deployment),
                min_context=min(contexts) if contexts else None,
                verdicts=ordered_counts(s.verdict or NOT_JUDGED_COUNT for _, s in pool),
                cost_per_hour=cost.models.get(name) if cost is not None else None))
    return ModelsView(inputs.now, served.revision if served else None, pass_info(inputs.last_pass, inputs.now),
                      tuple(models), cost.total if cost is not None else None)
