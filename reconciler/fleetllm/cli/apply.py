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
from typing import Any

from fleetllm.cli.common import EXIT_USAGE, CommandError
from fleetllm.cli.passes import (
    EXIT_ERROR,
    EXIT_OK,
    add_adopt_arguments,
    add_pass_arguments,
    apply_exit_code,
    control_note,
    load_config_arg,
    pass_runner,
    print_note,
    print_outcome,
)

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
    fleet = runner.read(walk=False)  # the revision as it is: apply does not walk back past an invalid head
    if saved is None and not args.yes and not runner.dry_run:
        if not sys.stdin.isatty():
            raise CommandError(NOT_A_TERMINAL, EXIT_USAGE)
        newest, controls = fleet, runner.controls(fleet)
        fleet = runner.pinned(newest, controls)  # what locked_pass will work from: the plan shown is that one's
        print_note(control_note(runner, newest, controls, fleet), args.format)
        shown = asyncio.run(runner.run(fleet, apply=False, record=False))
        print_outcome(shown, args.format)
        if shown.plan.empty:
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
    return apply_exit_code(outcome)
