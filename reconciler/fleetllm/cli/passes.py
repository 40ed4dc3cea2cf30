"""What `fleetllm plan`, `apply` and `reconcile` share: their arguments, the config they load, the
runner's options built from the flags, and printing a pass and its exit code. The pass itself, with
its lock, controls, pin, suspension, dry run and metrics, is the job's (fleetllm.job.runner)."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from fleetllm.cli.common import CONFIG_SEARCH, EXIT_USAGE, CommandError, add_repo_arguments, eprint, find_config
from fleetllm.core.fleet.files import WORKTREE_REVISION
from fleetllm.core.judge.adoption import AdoptSource

if TYPE_CHECKING:  # the job (HTTP clients, the state store, metrics) is imported when a pass runs
    from fleetllm.core.capacity import CapacityPlan
    from fleetllm.core.control import ControlState
    from fleetllm.core.fleet.model import Fleet
    from fleetllm.job.configfile import JobConfig
    from fleetllm.job.engine import PassOutcome
    from fleetllm.job.runner import PassRunner, RunnerOptions

EXIT_OK, EXIT_ERROR, EXIT_CHANGES = 0, 1, 2
EXIT_INVALID_HEAD = 3  # `reconcile --once`: the pass ran without errors on the last valid commit; the head is invalid


def add_pass_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE",
                        help="the control-plane config file (LiteLLM, providers, salt, state); default: "
                             f"{CONFIG_SEARCH}; without any: LITELLM_URL, LITELLM_MASTER_KEY, FLEETLLM_VLLM_API_SALT, "
                             "VAST_API_KEY, RUNPOD_API_KEY from the environment")
    add_repo_arguments(parser)
    parser.set_defaults(repo=None)
    parser.add_argument("--state", metavar="URL", help="state store (default: state.url of the config), "
                        "sqlite:///PATH, postgresql://user@host:port/dbname (password: state.password or "
                        "PGPASSFILE) or memory:")
    parser.add_argument("--lock-file", metavar="FILE", help="single-flight lock file (default: beside the SQLite "
                        "file); a PostgreSQL state store always uses its advisory lock instead")
    parser.add_argument("--metrics-file", metavar="FILE",
                        help="write the pass metrics there in the Prometheus text format after each pass that "
                             "ran, atomically, for node_exporter's textfile collector (default: "
                             "reconcile.metrics_file of the config)")


def add_adopt_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--adopt", choices=[s.value for s in AdoptSource], metavar="SOURCE",
                        help="adopt another control plane's LiteLLM deployments (llmao: self_hosted, no fleetllm "
                             "marker): a serving server gets fleetllm's deployment first, then the old one is "
                             "deleted; commercial entries are never touched")
    parser.add_argument("--prune-adopted", action="store_true",
                        help="with --adopt: also delete that owner's deployments for servers the repository does "
                             "not have (under the delete budget); without it they are reported and left")


def load_config_arg(args: argparse.Namespace) -> JobConfig:
    """The config (--config FILE, else the file found by find_config, else the environment); a
    ConfigurationError exits 1 (cli.main)."""
    from fleetllm.job.configfile import config_from_env, load_config

    path = find_config(args.config)
    config = load_config(path) if path is not None else config_from_env(os.environ)
    if (warning := config.salt.warning()) is not None:
        eprint(f"fleetllm {args.command}: warning: {warning}")
    return config


def runner_options(args: argparse.Namespace, *, push: bool = False) -> RunnerOptions:
    """The pass flags as the runner's options. A --repo that is not a directory is a usage error (exit 2)."""
    from fleetllm.job.runner import RunnerOptions

    if args.repo and not os.path.isdir(args.repo):
        raise CommandError(f"--repo {args.repo}: no such directory; give the fleet repository's directory "
                           "(or leave --repo out to read the config's repository)", EXIT_USAGE)
    return RunnerOptions(command=args.command, repo=args.repo, rev=args.rev, state_url=args.state,
                         lock_file=args.lock_file, metrics_file=args.metrics_file,
                         adopt=AdoptSource(args.adopt) if args.adopt else None,
                         prune_adopted=bool(args.prune_adopted), push=push)


def pass_runner(args: argparse.Namespace, config: JobConfig, *, push: bool = False) -> PassRunner:
    """The job's runner for this command: its words for a person on stderr."""
    from fleetllm.job.runner import PassRunner

    return PassRunner(runner_options(args, push=push), config, say=eprint)


def _since(at: float, actor: str, reason: str) -> str:
    when = datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return f"since {when} by {actor}" + (f": {reason}" if reason else " (no reason given)")


def control_note(runner: PassRunner, newest: Fleet, controls: ControlState, fleet: Fleet) -> str | None:
    """What `plan` and `apply` say about the operator controls before their plan: that the fleet is pinned
    (revision, who, when, why) and what the plan shows, that it is suspended (nothing of the plan is
    written); or, without a state store, that they cannot know."""
    if not runner.state_known():
        return ("Pin: unknown. No state store is configured (state.url in the config, or --state), so this "
                "plan cannot see an operator's pin (fleetllm pin) or suspension: the reconcile job reads them "
                "from its state store and may work from another revision than this plan.")
    lines = []
    pin = controls.pin
    if pin is not None:
        head = f"The fleet is PINNED to {pin.revision} {_since(pin.at, pin.actor, pin.reason)}."
        if fleet.revision == pin.revision:
            unpinned = "the working tree" if newest.revision == WORKTREE_REVISION else newest.revision[:12]
            ahead = "" if newest.revision == pin.revision else f", not {unpinned} (what it reads without the pin)"
            lines.append(f"{head} This plan, like the reconcile job, works from the pinned revision{ahead}, "
                         "until `fleetllm unpin`.")
        else:
            lines.append(f"{head} This plan shows {fleet.revision[:12]} as asked (--against REV); the reconcile "
                         f"job works from the pinned revision {pin.revision[:12]} until `fleetllm unpin`, "
                         "whatever is merged.")
    suspended = controls.suspended
    if suspended is not None:
        lines.append(f"The fleet is SUSPENDED {_since(suspended.at, suspended.actor, suspended.reason)}. The "
                     "reconcile job and apply write none of this plan to LiteLLM until `fleetllm resume`.")
    return "\n".join(lines) or None


def print_note(note: str | None, fmt: str = "text") -> None:
    """A note before the plan: on stdout with the text plan, on stderr beside a JSON one (stdout stays one
    JSON document)."""
    if note is not None:
        print(note + ("\n" if fmt == "text" else ""), file=sys.stderr if fmt == "json" else sys.stdout)


def print_outcome(outcome: PassOutcome, fmt: str = "text", *, plan: bool = True,
                  capacity: CapacityPlan | None = None) -> None:
    """The plan (unless `plan` is false: `apply` showed it before asking), then each write's result; `capacity`:
    the capacity plan, printed after the pass's (text) or as the JSON document's `capacity`."""
    from fleetllm.core.judge.observed import listing_prices
    from fleetllm.core.judge.plantext import render_json, render_text

    if plan:
        if fmt == "text" and (line := cost_line(outcome)):
            print(line + "\n")  # before the plan: its summary stays the last line, as Terraform's
        print(render_json(outcome.plan, outcome.intended, listing_prices(outcome.observation.listings),
                          capacity.as_json() if capacity is not None else None)
              if fmt == "json" else render_text(outcome.plan, outcome.intended))
        if fmt == "text" and capacity is not None:
            print("\n" + "\n".join(capacity.lines()))
    for result in outcome.results:
        mark = "ok" if result.ok else "FAILED"
        detail = f": {result.error}" if result.error else ""
        print(f"  {mark:6} {result.action.kind:7} {result.action.id}  {result.outcome}{detail}",
              file=sys.stderr if fmt == "json" else sys.stdout)


def capacity_plan(fleet: Fleet, outcome: PassOutcome, config: JobConfig) -> CapacityPlan | None:
    """The capacity plan beside the pass's (fleet.yaml `capacity:`): `+ rent` and `- terminate` with their
    prices, what is held and why (print_outcome shows it). None without a declaration."""
    from fleetllm.job.capacity import plan_pass_capacity

    return asyncio.run(plan_pass_capacity(fleet, outcome, config.providers))


def cost_line(outcome: PassOutcome) -> str | None:
    """`Cost: $7.67/h for 3 rented boxes (from the providers' listings)`; None when nothing is rented."""
    from fleetllm.core.cost import money

    cost = outcome.record.cost
    if cost is None:
        return None
    unpriced = f"; no price read for {', '.join(cost.unpriced)} (not counted)" if cost.unpriced else ""
    return (f"Cost: {money(cost.total)} for {len(cost.boxes)} rented box(es), from the providers' listings"
            f"{unpriced}.")


def apply_exit_code(outcome: PassOutcome) -> int:
    failed = any(not r.ok for r in outcome.results)
    return EXIT_ERROR if failed or outcome.plan.errors or outcome.plan.blocked else EXIT_OK


