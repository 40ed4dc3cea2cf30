"""`fleetllm diff [BASE] [HEAD]`: what merging HEAD will do to the running fleet, before it merges."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from fleetllm.adapters.git import GitFleetRepo
from fleetllm.cli.common import EXIT_INVALID, EXIT_OK, CommandError
from fleetllm.core.cost import CostChange, cost_change, money, read_prices
from fleetllm.core.diff import DEFAULT_MAX_CHARS, diff_fleets, render_json, render_markdown, render_text
from fleetllm.core.diff.invalid import render_invalid_json, render_invalid_markdown, render_invalid_text
from fleetllm.core.diff.sections import Section
from fleetllm.core.diff.waves import waves_json, waves_section, with_waves
from fleetllm.core.fleet.files import Snapshot
from fleetllm.core.fleet.jsonvalue import JSON
from fleetllm.core.fleet.model import Fleet, FleetSettings, frozen_map
from fleetllm.core.fleet.validate import Validation, validate_snapshot
from fleetllm.core.rollout.waves import plan_waves
from fleetllm.errors import SourceError

EXIT_CHANGES = 2  # with --detailed-exitcode only
DEFAULT_BASE_BRANCHES = ("origin/main", "main")

DESCRIPTION = """\
Compare two commits of a fleet repository and report what merging HEAD will do: per box, the
servers added, removed, moved or reconfigured (boot lifetime: the box must re-fetch its config and
restart vLLM) and whether it needs provisioning; the LiteLLM deployments the reconciler will
create, update, replace or delete (live lifetime); new bearers; models losing their last server.
Needs no salt and no network: bearers are named by where they derive from, never printed.

BASE defaults to the merge base of HEAD with --base-branch, which is what a pull request against
that branch changes (the comparison GitHub shows). Given explicitly, BASE is used as it is.

Commits only, by default: a fleet file edited but not committed is not in the comparison, and diff
says so on stderr (and refuses to say "No changes" while one is). --worktree compares the working
tree instead of HEAD: what your uncommitted edit will do once committed and merged."""

EPILOG = """\
exit status:
  0  the report was printed (with or without changes)
  1  BASE or HEAD is not a valid fleet (its errors are reported)
  2  usage or git error (unknown revision, not a git repository)
with --detailed-exitcode (Terraform's convention):
  0  no changes   1  any error   2  changes"""


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "diff", description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("base", nargs="?", metavar="BASE",
                        help="the commit to compare against (default: merge base of HEAD with --base-branch)")
    parser.add_argument("head", nargs="?", default="HEAD", metavar="HEAD", help="the proposed commit (default: HEAD)")
    parser.add_argument("--repo", default=".", metavar="DIR",
                        help="the fleet repository, or the directory of the fleet files inside a git repository "
                             "(default: the current directory)")
    parser.add_argument("--worktree", action="store_true",
                        help="compare the working tree's fleet files (uncommitted edits included) instead of "
                             "a HEAD commit")
    parser.add_argument("--base-branch", metavar="REF",
                        help="the branch changes merge into, for the default BASE "
                             f"(default: {' if it exists, else '.join(DEFAULT_BASE_BRANCHES)})")
    parser.add_argument("--format", choices=("text", "markdown", "json"), default="text",
                        help="text for a terminal, markdown for a pull-request comment, json for programs")
    parser.add_argument("--detailed-exitcode", action="store_true",
                        help="exit 0 without changes, 2 with changes, 1 on any error")
    parser.add_argument("--attach-plan", metavar="FILE",
                        help="append a plan saved by `fleetllm plan --against HEAD --out FILE` (JSON) or its text "
                             "output: what the reconciler would do against the live fleet if HEAD were merged")
    parser.add_argument("--prices", metavar="FILE",
                        help="price the boxes from FILE's `prices` (a plan saved by `fleetllm plan --out`, or "
                             "`{\"prices\": {BOX: {\"provider\", \"per_hour\", \"gpu\", \"gpus\"}}}`) and report "
                             "the cost the change adds or removes (default: the --attach-plan file's, when it has "
                             "them)")
    parser.add_argument("--max-chars", type=int, default=DEFAULT_MAX_CHARS, metavar="N",
                        help=f"cut the markdown report to N characters (default: {DEFAULT_MAX_CHARS}, under "
                             "GitHub's 65,536-character comment limit)")
    parser.set_defaults(run=run)


def base_revision(repo: GitFleetRepo, head: str, branch: str | None) -> str:
    """The merge base of HEAD with the tracked branch."""
    candidates = (branch,) if branch else DEFAULT_BASE_BRANCHES
    for candidate in candidates:
        try:
            tip = repo.resolve(candidate)
        except SourceError:
            continue
        bases = repo.repo.merge_base(head, tip)
        if not bases:
            raise CommandError(f"HEAD {head[:12]} and {candidate} have no common ancestor: pass BASE explicitly")
        return str(bases[0].hexsha)
    if branch:
        raise CommandError(f"--base-branch {branch}: no such branch or revision (fetch it first, e.g. "
                           f"`git fetch origin {branch.removeprefix('origin/')}`)")
    raise CommandError("no BASE given and neither origin/main nor main exists: pass BASE or --base-branch")


def validate_base(snapshot: Snapshot) -> Validation:
    """A BASE without any fleet file is an empty fleet: the pull request that adds the fleet shows all of it
    as new. A BASE with some of the files is validated as usual."""
    if all(content is None for content in snapshot.files.values()):
        return Validation(snapshot.revision, Fleet(snapshot.revision, FleetSettings(), frozen_map({}),
                                                   frozen_map({})), ())
    return validate_snapshot(snapshot)


def run(args: argparse.Namespace) -> int:
    try:
        return compare(args)
    except CommandError as exc:
        if args.detailed_exitcode:  # Terraform's convention: every error is 1, 2 means changes
            raise CommandError(str(exc), EXIT_INVALID) from None
        raise


UNCOMMITTED = ("{files} in {where} {have} uncommitted changes, which this diff leaves out (it compares commits): "
               "commit them, or pass --worktree to compare the working tree")


def compare(args: argparse.Namespace) -> int:
    if args.worktree and args.head != "HEAD":
        raise CommandError(f"--worktree compares the working tree: give BASE only, not HEAD {args.head}")
    try:
        repo = GitFleetRepo(args.repo)
        head = repo.resolve(args.head)
        base = repo.resolve(args.base) if args.base else base_revision(repo, head, args.base_branch)
        proposed = repo.worktree_snapshot() if args.worktree else repo.snapshot(head)
        uncommitted = () if args.worktree or args.head != "HEAD" else repo.uncommitted()
        sides = [("BASE", validate_base(repo.snapshot(base))), ("HEAD", validate_snapshot(proposed))]
    except SourceError as exc:
        raise CommandError(str(exc)) from None
    dirty = UNCOMMITTED.format(files=", ".join(uncommitted), where=repo.fleet_files_dir(),
                               have="has" if len(uncommitted) == 1 else "have") if uncommitted else None
    (_, old), (_, new) = sides
    if old.fleet is None or new.fleet is None:
        if args.format == "text":
            raise CommandError(render_invalid_text(sides).rstrip("\n"), EXIT_INVALID)
        print(render_invalid_markdown(sides, args.max_chars) if args.format == "markdown"
              else render_invalid_json(sides), end="")
        return EXIT_INVALID
    report = diff_fleets(old.fleet, new.fleet)
    if dirty is not None:
        if not report.changed:  # "No changes" would be wrong about what the user is looking at
            raise CommandError(f"no changes between the commits, but {dirty}")
        print(f"fleetllm diff: warning: {dirty}", file=sys.stderr)
    plan = attached_plan(args.attach_plan) if args.attach_plan else None
    waves = plan_waves(old.fleet, new.fleet)  # the staged rollout's waves (issue 14)
    report = with_waves(report, waves, new.fleet)
    rollout = waves_section(old.fleet, new.fleet, waves)
    change = cost_of(args, plan[1] if plan else None, old.fleet, new.fleet)
    costed = (Section("Cost (USD per hour, from the providers' listings)", f"{money(change.delta, sign=True)}",
                      change.text_lines()),) if change is not None and change.changed else ()
    extra = (*((rollout,) if rollout else ()), *((plan[0],) if plan else ()))
    if args.format == "markdown":
        print(render_markdown(report, extra, max_chars=args.max_chars,
                              cost=costed[0].lines if costed else ()), end="")
    elif args.format == "json":
        print(render_json(report, {"rollout": waves_json(old.fleet, new.fleet, waves),
                                   **({"plan": plan[1]} if plan else {}),
                                   **({"cost": change.as_json()} if change is not None else {})}), end="")
    else:
        print(render_text(report, (*costed, *extra)), end="")
    if args.detailed_exitcode and report.changed:
        return EXIT_CHANGES
    return EXIT_OK


def cost_of(args: argparse.Namespace, attached: JSON | None, base: Fleet, head: Fleet) -> CostChange | None:
    """The cost the change makes, from --prices FILE or the attached plan's prices; None without either."""
    document: JSON | None = None
    source = args.prices
    if args.prices:
        try:
            document = json.loads(Path(args.prices).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise CommandError(f"--prices {args.prices}: cannot read it as JSON ({exc})") from None
    elif isinstance(attached, dict) and "prices" in attached:
        document, source = attached, args.attach_plan
    if document is None:
        return None
    try:
        prices = read_prices(document)
    except ValueError as exc:
        raise CommandError(f"--prices {source}: {exc}") from None
    return cost_change(base, head, prices)


PLAN_TITLE = "Plan against the live fleet (what the reconciler would do if HEAD were merged)"


def attached_plan(path: str) -> tuple[Section, JSON]:
    """A plan file for the report: the section to render and the value for the JSON form.

    A JSON plan (`fleetllm plan --out`) is summarised from its actions; anything else is shown as the
    text `fleetllm plan` printed (its error, when the plan could not be made, is worth showing too)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CommandError(f"--attach-plan {path}: cannot read it ({exc})") from None
    try:
        document = json.loads(text)
    except ValueError:
        document = None
    if isinstance(document, dict) and isinstance(document.get("actions"), list):
        return Section(PLAN_TITLE, _plan_summary(document), tuple(_plan_lines(document))), document
    lines = tuple(line.rstrip() for line in text.splitlines()) or ("  (empty plan output)",)
    return Section(PLAN_TITLE, lines[-1].strip(), lines), text


def _plan_summary(document: dict[str, Any]) -> str:
    counts = document.get("summary")
    if isinstance(counts, dict):
        return (f"Plan: {counts.get('add', 0)} to add, {counts.get('change', 0)} to change, "
                f"{counts.get('destroy', 0)} to destroy.")
    return f"{len(document['actions'])} actions"


def _plan_lines(document: dict[str, Any]) -> list[str]:
    signs = {"create": "+", "update": "~", "delete": "-", "replace": "-/+"}
    lines = [f"! {error}" for error in document.get("errors") or [] if isinstance(error, str)]
    for action in document["actions"]:
        if isinstance(action, dict):
            kind = str(action.get("action", "?"))
            lines.append(f"{signs.get(kind, '?')} {kind} {action.get('id', '?')} {action.get('model_name', '')}"
                         f"  # {action.get('reason', '')}")
    lines.extend(f"  held {held.get('action', '?')} {held.get('id', '?')}  # {held.get('reason', '')}"
                 for held in document.get("held") or [] if isinstance(held, dict))
    lines.append(_plan_summary(document))
    return lines
