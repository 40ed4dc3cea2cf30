"""`fleetllm apply`: one reconcile pass that executes its plan.

Like `terraform apply`: on a terminal it plans first, shows the plan and applies it only after the
answer `yes`, and then exactly the plan shown (if the fleet or LiteLLM moved in between, nothing is
written: plan again). `--yes` applies without asking. Without a terminal on stdin (cron, CI, a script)
it refuses unless `--yes`: nobody is there to answer. Applying a saved plan (`fleetllm plan --out FILE`,
then `fleetllm apply FILE`) asks nothing: that plan was the one reviewed, and it is applied only if the
fleet still plans exactly it. Nor does a `reconcile.dry_run` config, which writes nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import TYPE_CHECKING, Any

from fleetllm.cli.common import EXIT_USAGE, CommandError
from fleetllm.cli.passes import (
    EXIT_ERROR,
    EXIT_OK,
    add_adopt_arguments,
    add_pass_arguments,
    apply_exit_code,
    capacity_plan,
    control_note,
    load_config_arg,
    pass_runner,
    print_note,
    print_outcome,
)

if TYPE_CHECKING:
    from fleetllm.core.capacity import CapacityPlan
    from fleetllm.core.fleet.model import Fleet
    from fleetllm.job.configfile import JobConfig
    from fleetllm.job.engine import PassOutcome

SHOWN = "the plan shown above"  # a SavedPlan's path when it is the plan apply just showed
PROMPT = "Do you want to perform these actions? Only 'yes' will be accepted to approve.\n  Enter a value: "
NOT_A_TERMINAL = ("refusing to apply without confirmation: stdin is not a terminal, so nobody can answer. Review "
                  "the plan (fleetllm plan), then pass --yes; or save it (fleetllm plan --out FILE) and apply "
                  "exactly that (fleetllm apply FILE)")


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "apply", description="Observe, judge, plan, and execute the plan (creates and updates first, deletes last).")
    parser.add_argument("plan_file", nargs="?", metavar="PLANFILE",
                        help="a plan saved by `fleetllm plan --out`: applied only if the fleet still plans exactly it")
    add_pass_arguments(parser)
    add_adopt_arguments(parser)
    parser.add_argument("--format", choices=("text", "json"), default="text")
    parser.add_argument("--yes", "--auto-approve", dest="yes", action="store_true",
                        help="apply without showing the plan and asking first (needed when stdin is not a terminal)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from fleetllm.job.runner import require_writer
    from fleetllm.job.saved import SavedPlan, signature

    config = load_config_arg(args)
    require_writer(config, args.command)
    saved = SavedPlan.load(args.plan_file) if args.plan_file else None  # PlanFileError: exit 1
    if saved is not None and saved.adopt_source is not None and not args.adopt:
        args.adopt = saved.adopt_source  # the plan adopted that owner's deployments: apply it the same way
    runner = pass_runner(args, config)
    shown_capacity: CapacityPlan | None = None
    fleet = runner.read(walk=False)  # the revision as it is: apply does not walk back past an invalid head
    if saved is None and not args.yes and not runner.dry_run:
        if not sys.stdin.isatty():
            raise CommandError(NOT_A_TERMINAL, EXIT_USAGE)
        newest, controls = fleet, runner.controls(fleet)
        fleet = runner.pinned(newest, controls)  # what locked_pass will work from: the plan shown is that one's
        print_note(control_note(runner, newest, controls, fleet), args.format)
        shown = asyncio.run(runner.run(fleet, apply=False, record=False))
        shown_capacity = capacity_plan(fleet, shown, config)
        print_outcome(shown, args.format, capacity=shown_capacity)
        if shown.plan.empty and (shown_capacity is None or shown_capacity.empty):
            return apply_exit_code(shown)  # nothing to do: nothing to ask
        ask = sys.stderr if args.format == "json" else sys.stdout  # stdout stays one JSON document
        print("\n" + PROMPT, end="", file=ask, flush=True)
        answer = sys.stdin.readline()  # "" at the end of input: not a yes
        if answer.strip() != "yes":
            print("\nApply cancelled: nothing was written.", file=ask)
            return EXIT_ERROR
        saved = SavedPlan(SHOWN, shown.plan.revision, signature(shown.plan), args.adopt or None)
    try:
        outcome = asyncio.run(runner.locked_pass(fleet, saved))
    finally:
        runner.close()  # notifications still queued: sent, or given up after notifications.drain_timeout_s
    if outcome is None:
        print("skipped: another reconcile pass is running")
        return EXIT_OK
    print_outcome(outcome, args.format, plan=saved is None or saved.path != SHOWN)
    code = apply_exit_code(outcome)
    if saved is None or saved.path == SHOWN:  # a saved plan file covers LiteLLM only: it rents nothing
        code = max(code, apply_capacity(fleet, outcome, config, args.format, shown_capacity,
                                        dry_run=runner.dry_run))
    return code


def apply_capacity(fleet: Fleet, outcome: PassOutcome, config: JobConfig, fmt: str, shown: CapacityPlan | None,
                   *, dry_run: bool) -> int:
    """Rent and terminate what the capacity plan says, after the pass (fleet.yaml `capacity:`). The plan is made
    again now; when one was shown and asked for, it must be the same rentals and terminations, else nothing is
    rented or terminated (plan again), as a stale LiteLLM plan is refused."""
    from fleetllm.job.capacity import execute_capacity, plan_pass_capacity
    from fleetllm.job.capacity import signature as capacity_signature

    out = sys.stderr if fmt == "json" else sys.stdout
    now = asyncio.run(plan_pass_capacity(fleet, outcome, config.providers))
    if now is None or now.empty:
        return EXIT_OK
    if shown is None:  # --yes: not shown before, so shown now
        print("\n" + "\n".join(now.lines()), file=out)
    elif capacity_signature(now) != capacity_signature(shown):
        print("\nCapacity changed since the plan shown (listings or offers moved): nothing rented or terminated; "
              "run fleetllm apply again", file=out)
        return EXIT_ERROR
    if dry_run:
        print("reconcile.dry_run: nothing rented or terminated", file=out)
        return EXIT_OK
    results = asyncio.run(execute_capacity(now, config.providers))
    for result in results:
        print(result.line(), file=out)
    return EXIT_OK if all(r.ok for r in results) else EXIT_ERROR
