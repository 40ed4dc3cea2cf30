"""`fleetllm reconcile`: the scheduled job. `--once` runs one pass (for cron, a systemd timer or a CI
schedule); otherwise a pass every `--interval` seconds (default: fleet.yaml reconcile.interval_s) with
jitter, until SIGTERM. Each pass re-reads the tracked branch and runs on its newest valid commit: an
invalid head never stops reconciling (a server that crashes meanwhile still loses its deployment); it is
reported on stderr, in the log, the pass record and the metrics, and by `--once`'s exit status 3."""

from __future__ import annotations

import argparse
import asyncio
import logging
from typing import Any

from fleetllm.cli.common import CommandError
from fleetllm.cli.passes import (
    EXIT_INVALID_HEAD,
    EXIT_OK,
    InvalidHead,
    PassRunner,
    add_adopt_arguments,
    add_pass_arguments,
    apply_exit_code,
    load_config_arg,
    load_tracked,
    print_outcome,
    require_writer,
)
from fleetllm.core.fleet.model import Fleet
from fleetllm.job.configfile import ReconcileConfig
from fleetllm.job.loop import LOG, run_forever
from fleetllm.logs import log_event, resolve_level, set_level
from fleetllm_contract.logfmt import add_level_argument


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "reconcile", help="run reconcile passes on a schedule (or --once)",
        description="Converge LiteLLM with the fleet: one pass per interval, with jitter, one at a time. Each "
                    "pass runs on the newest valid commit of the tracked branch: when the head is not valid, the "
                    "pass goes on with the last valid commit and says so.",
        epilog="Exit status of --once: 0 the pass ran without errors (or another pass held the lock); 1 the pass "
               "failed (a LiteLLM write failed, observation errors, a safety valve held deletes) or could not run "
               "(no valid commit at all, the tracked repository, the state store, the config); 2 usage (a bad option "
               "or --repo directory); 3 the "
               "pass ran without "
               "errors on the last valid commit because the branch head is not valid (push a fix or a revert). "
               "The systemd unit counts 3 as success (SuccessExitStatus=3); a Kubernetes Job counts only 0, so "
               "the CronJob passes --invalid-head-exit 0 and watches fleetllm_last_attempted_revision_valid.")
    add_pass_arguments(parser)
    add_adopt_arguments(parser)
    when = parser.add_mutually_exclusive_group()
    when.add_argument("--interval", type=float, metavar="SECONDS",
                      help="seconds between passes (default: fleet.yaml reconcile.interval_s)")
    when.add_argument("--once", action="store_true",
                      help="run one pass and exit with its status; a pass that ran pushes its metrics to "
                           "reconcile.pushgateway of the config (and writes --metrics-file), a failed push "
                           "never changing the status")
    parser.add_argument("--metrics-listen", metavar="HOST:PORT",
                        help="serve Prometheus metrics there while looping")
    parser.add_argument("--invalid-head-exit", type=int, choices=(EXIT_INVALID_HEAD, EXIT_OK),
                        default=EXIT_INVALID_HEAD, metavar="CODE",
                        help=f"with --once: the exit status when the pass ran without errors on the last valid "
                             f"commit because the branch head is not valid: {EXIT_INVALID_HEAD} (default) or "
                             f"{EXIT_OK} (for a scheduler that counts only 0 as success, e.g. a Kubernetes Job)")
    add_level_argument(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    config = load_config_arg(args)
    set_level(resolve_level(args.log_level, default=config.settings.log_level))  # the flag, else the env or the file
    require_writer(config, "reconcile")
    fleet, invalid_head = load_tracked(args, config)  # the newest valid commit; none at all: exit 1
    runner = PassRunner(args, config, push=bool(args.once))  # looping, it serves /metrics instead
    try:
        return loop(args, config, fleet, invalid_head, runner)
    finally:
        runner.close()  # notifications still queued: sent, or given up after notifications.drain_timeout_s


def loop(args: argparse.Namespace, config: ReconcileConfig, fleet: Fleet, invalid_head: InvalidHead | None,
         runner: PassRunner) -> int:
    if args.once:
        outcome = asyncio.run(runner.locked_apply(fleet, invalid_head=invalid_head))
        if outcome is None:
            return EXIT_OK
        print_outcome(outcome)
        code = apply_exit_code(outcome)
        return args.invalid_head_exit if code == EXIT_OK and invalid_head is not None else code
    if args.metrics_listen:
        from prometheus_client import start_http_server

        host, _, port = args.metrics_listen.rpartition(":")
        start_http_server(int(port), addr=host or "127.0.0.1", registry=runner.metrics.registry)
    current: list[Fleet] = [fleet]
    head: list[InvalidHead | None] = [invalid_head]

    async def one_pass() -> int:
        try:
            current[0], head[0] = load_tracked(args, config)
        except CommandError as exc:
            log_event(LOG, "fleet_invalid", logging.WARNING, error=str(exc), keeping=current[0].revision)
        try:
            outcome = await runner.locked_apply(current[0], invalid_head=head[0])
        except Exception as exc:
            runner.crashed(exc)
            raise
        return apply_exit_code(outcome) if outcome is not None else EXIT_OK

    def interval() -> float:
        return float(args.interval or current[0].settings.reconcile.interval_s)

    return asyncio.run(run_forever(one_pass, interval, runner.metrics, wake=runner.take_sync))
