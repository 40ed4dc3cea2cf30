"""`fleetllm plan`: observe the fleet and show what `apply` would change in LiteLLM (writes nothing)."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

from fleetllm.cli.common import CommandError
from fleetllm.cli.passes import (
    EXIT_CHANGES,
    EXIT_ERROR,
    EXIT_OK,
    add_adopt_arguments,
    add_pass_arguments,
    capacity_plan,
    control_note,
    load_config_arg,
    pass_runner,
    print_note,
    print_outcome,
)


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "plan",
        description="Observe providers, servers and LiteLLM; judge every server; print the plan. Writes nothing.")
    add_pass_arguments(parser)
    add_adopt_arguments(parser)
    parser.add_argument("--format", choices=("text", "json"), default="text")
    parser.add_argument("--against", dest="rev", metavar="REV",
                        help="plan the fleet at REV (e.g. a pull request's head) against the live observation: "
                             "what the reconciler would do if REV were merged")
    parser.add_argument("--out", metavar="FILE",
                        help="also save the plan (JSON, no secret) for `fleetllm apply FILE` to apply exactly")
    parser.add_argument("--detailed-exitcode", action="store_true",
                        help="exit 0 when there is nothing to do, 1 on error, 2 when there are changes")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    config = load_config_arg(args)
    runner = pass_runner(args, config)
    newest = runner.read()  # the job's newest valid commit (--against REV: REV)
    controls = runner.controls(newest)
    fleet = runner.pinned(newest, controls, follow=args.rev is None)  # as the reconcile job does; --against is kept
    print_note(control_note(runner, newest, controls, fleet), args.format)
    outcome = asyncio.run(runner.run(fleet, apply=False, invalid_head=runner.invalid_head))
    capacity = capacity_plan(fleet, outcome, config)
    print_outcome(outcome, args.format, capacity=capacity)
    if args.out:
        from fleetllm.core.judge.observed import listing_prices
        from fleetllm.core.judge.plantext import render_json

        try:
            prices = listing_prices(outcome.observation.listings)
            prices |= {r.request.label: r.price for r in capacity.rentals} if capacity is not None else {}
            Path(args.out).write_text(render_json(outcome.plan, outcome.intended, prices,
                                                  capacity.as_json() if capacity is not None else None) + "\n",
                                      encoding="utf-8")
        except OSError as exc:
            raise CommandError(f"cannot write the plan to {args.out}: {exc.strerror}", EXIT_ERROR) from None
    errors = list(outcome.plan.errors)
    if config.litellm_url is None:  # not a failure: this config has no LiteLLM, and the output says so
        errors = [e for e in errors if not e.startswith("LiteLLM listing: ")]
    if errors:
        return EXIT_ERROR
    if args.detailed_exitcode and (not outcome.plan.empty or (capacity is not None and not capacity.empty)):
        return EXIT_CHANGES
    return EXIT_OK
