"""`fleetllm reconcile`: the scheduled job. `--once` runs one pass (for cron, a systemd timer or a CI
schedule); otherwise a pass every `--interval` seconds (default: fleet.yaml reconcile.interval_s) with
jitter, until SIGTERM. Each pass re-reads the tracked branch and runs on its newest valid commit: an
invalid head never stops reconciling (a server that crashes meanwhile still loses its deployment); it is
reported on stderr, in the log, the pass record and the metrics, and by `--once`'s exit status 3."""

from __future__ import annotations

import argparse
import asyncio
import logging
from typing import TYPE_CHECKING, Any

from fleetllm.cli.passes import (
    EXIT_INVALID_HEAD,
    EXIT_OK,
    add_adopt_arguments,
    add_pass_arguments,
    apply_exit_code,
    load_config_arg,
    pass_runner,
    print_outcome,
)
from fleetllm.logs import resolve_level, set_level
from fleetllm_contract.logfmt import add_level_argument

if TYPE_CHECKING:
    from fleetllm.job.runner import PassRunner


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "reconcile",
        description="Converge LiteLLM with the fleet: one pass per interval, with jitter, one at a time. Each "
                    "pass runs on the newest valid commit of the tracked branch: when the head is not valid, the "
                    "pass goes on with the last valid commit and says so.",
        epilog="Exit status of --once: 0 the pass ran without errors (or another pass held the lock); 1 the pass "
               "failed (a LiteLLM write failed, observation errors, a safety valve held deletes) or could not run "
               "(no valid commit at all, the repository or a revision in it, the state store, the config); 2 usage "
               "(a bad option, or a --repo that is not a directory); 3 the pass ran without errors on the last "
               "valid commit because the branch head is not valid (push a fix or a revert). "
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
                        help="serve Prometheus metrics there while looping (/metrics; with metrics_token in the "
                             "config, only to that bearer; /health/live answers ok to anyone)")
    parser.add_argument("--invalid-head-exit", type=int, choices=(EXIT_INVALID_HEAD, EXIT_OK),
                        default=EXIT_INVALID_HEAD, metavar="CODE",
                        help=f"with --once: the exit status when the pass ran without errors on the last valid "
                             f"commit because the branch head is not valid: {EXIT_INVALID_HEAD} (default) or "
                             f"{EXIT_OK} (for a scheduler that counts only 0 as success, e.g. a Kubernetes Job)")
    add_level_argument(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from fleetllm.job.runner import require_writer

    config = load_config_arg(args)
    set_level(resolve_level(args.log_level, default=config.settings.log_level))  # the flag, else the env or the file
    require_writer(config, args.command)
    runner = pass_runner(args, config, push=bool(args.once))  # looping, it serves /metrics instead
    runner.read()  # the newest valid commit of the tracked branch; none at all: exit 1
    try:
        return loop(args, runner)
    finally:
        runner.close()  # notifications still queued: sent, or given up after notifications.drain_timeout_s


def loop(args: argparse.Namespace, runner: PassRunner) -> int:
    if args.once:
        assert runner.fleet is not None
        outcome = asyncio.run(runner.locked_pass(runner.fleet, invalid_head=runner.invalid_head))
        if outcome is None:
            return EXIT_OK
        print_outcome(outcome)
        code = apply_exit_code(outcome)
        return args.invalid_head_exit if code == EXIT_OK and runner.invalid_head is not None else code
    if args.metrics_listen:  # /metrics behind metrics_token when the config sets it; /health/live for probes
        from fleetllm.job.metrics import serve_metrics
        from fleetllm.logs import get_logger, log_event
        from fleetllm.settings import Listen, metrics_token_warning

        settings = runner.config.settings
        server = serve_metrics(args.metrics_listen, runner.metrics.registry, settings.metrics_token)
        bound = Listen(str(server.server_address[0]), server.server_port)
        if (public := metrics_token_warning(settings, bound)) is not None:
            log_event(get_logger("reconcile"), "public metrics", logging.WARNING, warning=public)
    return asyncio.run(runner.loop(args.interval))  # each pass re-reads the branch (PassRunner.scheduled_pass)
