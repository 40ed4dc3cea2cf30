"""`llmfleet reconcile`: the scheduled job. `--once` runs one pass (for cron, a systemd timer or a CI
schedule); otherwise a pass every `--interval` seconds (default: fleet.yaml reconcile.interval_s) with
jitter, until SIGTERM. Each pass re-reads the repository and keeps the last valid fleet when a new
revision is invalid."""

from __future__ import annotations

import argparse
import asyncio
import logging
from typing import Any

from llmfleet.cli.common import CommandError
from llmfleet.cli.passes import (
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
from llmfleet.core.fleet.model import Fleet
from llmfleet.job.loop import LOG, run_forever
from llmfleet.logs import log_event, resolve_level, set_level
from llmfleet_contract.logfmt import add_level_argument


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "reconcile", help="run reconcile passes on a schedule (or --once)",
        description="Converge LiteLLM with the fleet: one pass per interval, with jitter, one at a time.")
    add_pass_arguments(parser)
    add_adopt_arguments(parser)
    when = parser.add_mutually_exclusive_group()
    when.add_argument("--interval", type=float, metavar="SECONDS",
                      help="seconds between passes (default: fleet.yaml reconcile.interval_s)")
    when.add_argument("--once", action="store_true", help="run one pass and exit with its status")
    parser.add_argument("--metrics-listen", metavar="HOST:PORT",
                        help="serve Prometheus metrics there while looping")
    add_level_argument(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    config = load_config_arg(args)
    set_level(resolve_level(args.log_level, default=config.settings.log_level))  # the flag, else the env or the file
    require_writer(config, "reconcile")
    fleet = load_fleet(args, config)  # the first revision must be valid
    runner = PassRunner(args, config)
    if args.once:
        outcome = asyncio.run(runner.locked_apply(fleet))
        if outcome is None:
            return EXIT_OK
        print_outcome(outcome)
        return apply_exit_code(outcome)
    if args.metrics_listen:
        from prometheus_client import start_http_server

        host, _, port = args.metrics_listen.rpartition(":")
        start_http_server(int(port), addr=host or "127.0.0.1", registry=runner.metrics.registry)
    current: list[Fleet] = [fleet]

    async def one_pass() -> int:
        try:
            current[0] = load_fleet(args, config)
        except CommandError as exc:
            log_event(LOG, "fleet_invalid", logging.WARNING, error=str(exc), keeping=current[0].revision)
        outcome = await runner.locked_apply(current[0])
        return apply_exit_code(outcome) if outcome is not None else EXIT_OK

    def interval() -> float:
        return float(args.interval or current[0].settings.reconcile.interval_s)

    return asyncio.run(run_forever(one_pass, interval, runner.metrics))
