"""`llmfleet apply`: one reconcile pass that executes its plan."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from llmfleet.cli.common import CommandError
from llmfleet.cli.passes import (
    EXIT_ERROR,
    EXIT_OK,
    PassRunner,
    add_adopt_arguments,
    add_pass_arguments,
    apply_exit_code,
    load_config_arg,
    load_fleet,
    print_outcome,
    require_writer,
)
from llmfleet.job.saved import PlanFileError, SavedPlan


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "apply", help="run one reconcile pass: converge LiteLLM's deployments",
        description="Observe, judge, plan, and execute the plan (creates and updates first, deletes last).")
    parser.add_argument("plan_file", nargs="?", metavar="PLANFILE",
                        help="a plan saved by `llmfleet plan --out`: applied only if the fleet still plans exactly it")
    add_pass_arguments(parser)
    add_adopt_arguments(parser)
    parser.add_argument("--format", choices=("text", "json"), default="text")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    config = load_config_arg(args)
    require_writer(config, "apply")
    fleet = load_fleet(args, config)
    try:
        saved = SavedPlan.load(args.plan_file) if args.plan_file else None
    except PlanFileError as exc:
        raise CommandError(str(exc), EXIT_ERROR) from None
    if saved is not None and saved.adopt_source is not None and not args.adopt:
        args.adopt = saved.adopt_source  # the plan adopted that owner's deployments: apply it the same way
    runner = PassRunner(args, config)
    try:
        outcome = asyncio.run(runner.locked_apply(fleet, saved))
    finally:
        runner.close()  # notifications still queued: sent, or given up after notifications.drain_timeout_s
    if outcome is None:
        print("skipped: another reconcile pass is running")
        return EXIT_OK
    print_outcome(outcome, args.format)
    return apply_exit_code(outcome)
