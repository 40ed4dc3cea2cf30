"""What the demo shows: one row per server (its box, its Supervisor program, the reconciler's verdict
and its LiteLLM deployment), built purely from a pass outcome and the boxes' Supervisor states, then
drawn as a rich table under a header of where to look."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rich import box as rich_box
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.table import Table
from rich.text import Text

from fleetllm.core.judge.plan import ActionKind
from fleetllm.core.judge.plantext import SYMBOL, summary_line
from fleetllm.core.judge.verdict import Verdict
from fleetllm.job.apply import ActionOutcome, ActionResult
from fleetllm.job.engine import PassOutcome

COLOURS = {Verdict.HEALTHY: "green", Verdict.STALE: "yellow", Verdict.LOADING: "yellow", Verdict.PENDING: "yellow",
           Verdict.DOWN: "red", Verdict.STALLED: "red", Verdict.FOREIGN: "red", Verdict.MISSING: "red",
           Verdict.UNKNOWN: "magenta"}
VERDICTS = frozenset(str(v) for v in Verdict)
PROGRAM_PREFIX = "fleetllm-"  # fleetllm_installer.units.PREFIX: the Supervisor program of server NAME is fleetllm-NAME
BoxStates = Mapping[str, Mapping[str, str] | None]  # box -> program -> Supervisor state (None: no answer)


@dataclass(frozen=True)
class Row:
    box: str
    port: int
    server: str
    model: str
    supervisor: str
    verdict: str
    reason: str
    litellm: str


def _supervisor(states: BoxStates, box: str, server: str) -> str:
    programs = states.get(box)
    if programs is None:
        return "no supervisord"
    return programs.get(PROGRAM_PREFIX + server, "-")


def rows(outcome: PassOutcome, states: BoxStates, *, applying: bool) -> list[Row]:
    plan = outcome.plan
    deployed = {d.id for d in outcome.observation.deployments or () if d.managed}
    planned = {a.id: a.kind for a in plan.actions}
    held = {h.id for h in plan.held}

    def litellm(ident: str) -> str:
        kind = planned.get(ident)
        if kind is not None:
            verb = {ActionKind.CREATE: "create", ActionKind.UPDATE: "update", ActionKind.REPLACE: "replace",
                    ActionKind.DELETE: "delete"}[kind]
            return f"{SYMBOL[kind]} {verb}" if applying else f"{SYMBOL[kind]} would {verb}"
        if ident in held:
            return "held"
        if outcome.observation.boxes_route:
            return "none (box routes)"
        return "deployed" if ident in deployed else "-"

    found = []
    for key, server in sorted(outcome.intended.servers.items()):
        judgement = plan.judgements[key]
        found.append(Row(server.box, server.port, server.name, server.model,
                         _supervisor(states, server.box, server.name), str(judgement.verdict), judgement.reason,
                         litellm(server.id)))
    intended = {s.id for s in outcome.intended.servers.values()}
    for deployment in outcome.observation.deployments or ():
        where = deployment.recorded_key
        if deployment.managed and deployment.id not in intended and where is not None:
            name = deployment.info_str("fleetllm_server") or deployment.model_name
            found.append(Row(where[0], where[1], name, deployment.model_name, _supervisor(states, where[0], name),
                             "-", "no longer in the repository", litellm(deployment.id)))
    return found


def written(results: Sequence[ActionResult]) -> list[tuple[str, str]]:
    """What the demo says of a pass's LiteLLM writes, (line, style): only writes that were tried. A pass that
    only plans records every action as planned, not applied; the table shows those (`+ would create`)."""
    return [(f"  LiteLLM {r.action.kind} {r.action.id} ({r.action.model_name})"
             + ("" if r.ok else " FAILED: " + (r.error or "")), "cyan" if r.ok else "red")
            for r in results if r.outcome is not ActionOutcome.PLANNED]


STUB_TITLE = "Simulated boxes (no GPU: every vLLM is the stub)"


def title(real: Sequence[str] = ()) -> str:
    """The table's title: with --real-vllm, which box runs the real vLLM."""
    if not real:
        return STUB_TITLE
    return (f"Boxes (no GPU: every vLLM is the stub but on {', '.join(real)}, which runs the real vLLM's "
            "CPU build)")


WIDE = 150  # columns from which the table has a column per field; below, the compact form (80 columns do)


def table(found: Sequence[Row], real: Sequence[str] = (), width: int = WIDE) -> RenderableType:
    """The servers as a table: a column per field on a wide terminal; on a narrow one (80 columns) one
    column names the server (box:port name [model]), and the reasons follow the table, one line each,
    for the servers that are not Healthy (a Healthy server's reason says only where it serves)."""
    if width >= WIDE:
        grid = Table(title=title(real), title_justify="left", expand=False)
        for column in ("box", "port", "server", "model", "supervisor", "verdict", "LiteLLM", "why"):
            grid.add_column(column, no_wrap=column != "why", overflow="fold")
        for row in found:
            grid.add_row(row.box, str(row.port), row.server, row.model, _supervisor_text(row), _verdict_text(row),
                         row.litellm, Text(row.reason[:110], style="dim"))
        return grid
    grid = Table(title=title(real), title_justify="left", expand=False, box=rich_box.SIMPLE_HEAD, pad_edge=False,
                 collapse_padding=True)
    for column in ("server", "program", "verdict", "LiteLLM"):
        grid.add_column(column, no_wrap=True, overflow="ellipsis")
    for row in found:
        grid.add_row(Text(_server_text(row)), _supervisor_text(row), _verdict_text(row), Text(row.litellm))
    why = [Text(_shorten(f"  {_server_text(row)}: {row.reason}", width), style="dim")
           for row in found if row.verdict != str(Verdict.HEALTHY) and row.reason]
    return Group(grid, *why)


def _server_text(row: Row) -> str:
    return f"{row.box}:{row.port} {row.server}" + ("" if row.model == row.server else f" [{row.model}]")


def _supervisor_text(row: Row) -> Text:
    return Text(row.supervisor, style="green" if row.supervisor == "RUNNING" else "yellow")


def _verdict_text(row: Row) -> Text:
    return Text(row.verdict, style=COLOURS.get(Verdict(row.verdict), "white") if row.verdict in VERDICTS else "dim")


def _shorten(line: str, width: int) -> str:
    return line if len(line) <= width else line[:max(width - 3, 0)] + "..."


class Fitted:
    """The table, laid out for the width it is drawn at (the terminal's, which may change under the live
    display)."""

    def __init__(self, found: Sequence[Row], real: Sequence[str]) -> None:
        self.found, self.real = found, real

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield table(self.found, self.real, options.max_width)


def screen(header: Sequence[str], outcome: PassOutcome | None, states: BoxStates, *, applying: bool,
           note: str = "", real: Sequence[str] = ()) -> RenderableType:
    parts: list[RenderableType] = [Text("\n".join(header))]
    if outcome is None:
        parts.append(Text("waiting for the first reconcile pass...", style="dim"))
    else:
        parts.append(Fitted(rows(outcome, states, applying=applying), real))
        line = ("No LiteLLM: the boxes route, the rollout restarts them box by box." if outcome.observation.boxes_route
                else summary_line(outcome.plan))
        parts.append(Text(f"revision {outcome.intended.revision[:12]}  " + line
                          + ("" if applying or outcome.observation.boxes_route
                             else "  (plan only: nothing is written)")))
    if note:
        parts.append(Text(note, style="bold"))
    return Group(*parts)
