"""`fleetllm-gateway --config FILE [--check] [--box-json] [--workers N] [--busy-poll MICROSECONDS]
[--log-level LEVEL]` (also `fleetllm gateway`, `python3 box.pyz gateway`).

Exit 0 after a clean stop, a valid `--check` or `--version`, 1 on an invalid configuration or a failed
bind. LLMhop's single-dash spellings (`-config`, `-check`) are accepted too. While it serves, every log
line is JSON (fleetllm_contract.logfmt), at `--log-level`, else FLEETLLM_LOG_LEVEL, else info;
`--check` answers in plain text.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from fleetllm_contract.logfmt import add_level_argument, configure, resolve_level
from fleetllm_gateway import __version__, native
from fleetllm_gateway.busypoll import DEFAULT_LIMIT_US
from fleetllm_gateway.config import ConfigError, GatewayConfig, load_config

log = logging.getLogger("gateway")


def build_parser(prog: str = "fleetllm-gateway") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, description="One port, many models: an LLMhop-compatible router for OpenAI-style backends.")
    add_arguments(parser)
    return parser


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--version", "-version", action="version", version=f"fleetllm-gateway {__version__}")
    parser.add_argument("--config", "-config", default="config.json", metavar="FILE",
                        help="the JSON configuration (default: config.json in the working directory)")
    parser.add_argument("--check", "-check", action="store_true",
                        help="validate the configuration and build the router without binding; secret references "
                             "are checked for syntax but not read. Exit 0 valid, 1 invalid")
    parser.add_argument("--box-json", "-box-json", action="store_true",
                        help="the config was written from a box JSON (the installer sets this): only ${cred:...} "
                             "secret references are read, and every model url must be on this box (loopback or "
                             "a unix socket)")
    parser.add_argument("--workers", "-workers", type=_workers, default=None, metavar="N",
                        help="worker processes sharing the port (default: the CPUs this process may use, at most "
                             "8; 1: one process, no master). Every model's concurrency limit holds across them")
    parser.add_argument("--busy-poll", "-busy-poll", type=_busy_poll, default=DEFAULT_LIMIT_US, metavar="MICROSECONDS",
                        help="the longest a worker with nothing else to do polls for a short wait before it "
                             f"sleeps (default: {DEFAULT_LIMIT_US}; adapted to how long the waits are; 0: never). It "
                             "saves the cost of waking up, at the CPU time it polls (gateway/README.md, "
                             "\"Busy-polling\")")
    add_level_argument(parser)


def _workers(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 1024:
        raise argparse.ArgumentTypeError(f"expected a number of workers from 1 to 1024, got {text!r}")
    return value


def _busy_poll(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 1000:
        raise argparse.ArgumentTypeError(f"expected microseconds from 0 (never) to 1000, got {text!r}")
    return value


def main(argv: list[str] | None = None) -> int:
    return run_parsed(build_parser().parse_args(argv))


def run_parsed(args: argparse.Namespace) -> int:
    """`run` with what `add_arguments` parsed (`fleetllm gateway` runs this too)."""
    return run(Path(args.config), check=args.check, log_level=args.log_level, box_json=args.box_json,
               workers=args.workers, busy_poll_us=args.busy_poll)


def run(config_path: Path, *, check: bool, log_level: str | None = None, box_json: bool = False,
        workers: int | None = None, busy_poll_us: int = DEFAULT_LIMIT_US) -> int:
    try:
        level = resolve_level(log_level)
    except ValueError as exc:
        print(f"fleetllm-gateway: {exc}", file=sys.stderr)
        return 2
    configure(logging.getLogger(), level, fmt="text" if check else "json", prog="fleetllm-gateway")
    if native.STATUS.asked and not native.STATUS.compiled:
        log.warning("compiled modules not used, running the Python ones", extra={"fields": {
            "reason": native.STATUS.reason}})
    try:
        config = load_config(config_path, expand_secrets=not check, box_json=box_json)
    except ConfigError as exc:
        for problem in exc.problems:
            if check:
                print(problem, file=sys.stderr)
            else:
                log.error("invalid configuration", extra={"fields": {"problem": problem}})
        return 1
    # Imported here so `--check` on a config error needs no import time of the server's modules.
    from fleetllm_gateway.app import Gateway
    from fleetllm_gateway.proxyenv import ProxyError
    from fleetllm_gateway.serve import BindError, serve, serve_forever

    if check:
        Gateway(config).close()
        compiled = "; compiled modules" if native.STATUS.compiled else ""  # the installer reads this
        print(f"{config_path}: valid ({len(config.models)} models, {len(config.listed)} listed{compiled})")
        return 0

    def reload() -> GatewayConfig:
        return load_config(config_path, expand_secrets=True, box_json=box_json)

    try:
        if workers is None:
            from fleetllm_gateway.workers import default_workers

            workers = default_workers()
        if workers == 1:
            return serve_forever(serve(config, reload=reload, busy_poll_us=busy_poll_us))
        import os

        from fleetllm_gateway.workers import WorkerError, run_workers

        Gateway(config, environ=os.environ).close()  # a proxy it cannot use: refused before any fork
        try:
            return run_workers(config, workers, reload, busy_poll_us)
        except WorkerError as exc:
            log.error("cannot serve", extra={"fields": {"error": str(exc)}})
            return 1
    except (BindError, ProxyError) as exc:
        log.error("cannot serve", extra={"fields": {"error": str(exc)}})
        return 1
