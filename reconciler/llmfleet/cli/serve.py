"""`llmfleet serve --config FILE [--listen HOST:PORT] [--insecure-http] [--check]`: the control plane.

Runs the Flask app in process behind Tornado's HTTP server (one event loop reads every connection,
a pool of `server.threads` runs complete requests: reconciler/llmfleet/server/httpserver.py), HTTPS when the
config has a certificate and key. Without TLS it only listens on loopback addresses unless --insecure-http.
`--check` runs the whole start-up path (config, secrets, TLS files, state store and its migrations,
the repository and its last valid commit, every box rendered, the installer built) and exits 0, or
1 with the reason, without binding a port.
"""

from __future__ import annotations

import argparse
import logging
import ssl
import sys
from typing import Any

from llmfleet.cli.common import EXIT_INVALID, EXIT_OK, CommandError
from llmfleet.errors import ConfigurationError, SourceError, StateError
from llmfleet.logs import get_logger, log_event
from llmfleet.settings import MIN_FLEET_KEY_CHARS, ControlPlaneConfig, Listen, fleet_key_warning, load_config


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "serve", help="run the control plane (GET /vllm/config and friends)",
        description="Serve every box its JSON from the last valid commit of the tracked branch.")
    parser.add_argument("--config", required=True, metavar="FILE", help="the control plane's config file")
    parser.add_argument("--listen", metavar="HOST:PORT", help="override the config's listen address")
    parser.add_argument("--insecure-http", action="store_true",
                        help="allow plain HTTP on a non-loopback address (boxes would send the fleet key in clear)")
    parser.add_argument("--check", action="store_true",
                        help="run the whole start-up path without binding a port; exit 0 if it would serve")
    parser.set_defaults(run=run)


def _listen(args: argparse.Namespace, config: ControlPlaneConfig) -> Listen:
    listen = config.listen
    if args.listen:
        try:
            listen = Listen.parse(args.listen)
        except ValueError as exc:
            raise CommandError(f"--listen: {exc}") from None
    if config.tls is None and not listen.is_loopback and not args.insecure_http:
        raise CommandError(f"refusing plain HTTP on {listen.bind}: boxes send the fleet key with every request. "
                           "Configure tls {cert, key}, listen on a loopback address behind a TLS proxy, or pass "
                           "--insecure-http", EXIT_INVALID)
    if config.tls is not None:
        try:
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(config.tls.cert, config.tls.key)
        except (ssl.SSLError, OSError) as exc:
            raise CommandError(f"tls: cannot load {config.tls.cert} with {config.tls.key}: {exc}",
                               EXIT_INVALID) from None
    return listen


def check(config: ControlPlaneConfig, listen: Listen) -> list[str]:
    """The start-up path once, then closed again. Returns warnings; raises CommandError on failure."""
    from llmfleet.server.runtime import start_up

    try:
        runtime = start_up(config)
    except (StateError, SourceError, OSError) as exc:
        raise CommandError(str(exc), EXIT_INVALID) from None
    try:
        tracker = runtime.tracker
        served, attempted = tracker.served, tracker.attempted
        if served is None:
            errors = "\n".join(attempted.errors) if attempted else ""
            raise CommandError(f"no valid commit on branch {runtime.repo.branch} of {runtime.repo.where}; nothing "
                               f"to serve:\n{errors}", EXIT_INVALID)
        if served.render_errors:
            raise CommandError("\n".join(f"box {box}: {why}" for box, why in served.render_errors.items()),
                               EXIT_INVALID)
        warnings = []
        if attempted is not None and not attempted.valid:
            warnings.append(f"warning: the branch head {attempted.revision[:12]} is invalid; serving "
                            f"{served.revision[:12]} instead:\n" + "\n".join(attempted.errors))
        if (salt_warning := config.secrets.vllm_api_salt.warning()) is not None:
            warnings.append(f"warning: secrets.vllm_api_salt: {salt_warning}")
        if config.secrets.fleet_key is None:
            warnings.append("warning: no secrets.fleet_key: every box request will get 503")
        if (short_key := fleet_key_warning(config)) is not None:
            warnings.append(short_key)
            log_event(get_logger("serve"), "short fleet key", logging.WARNING,
                      reference=config.secrets.fleet_key.reference if config.secrets.fleet_key else None,
                      length=len(config.secrets.fleet_key.reveal()) if config.secrets.fleet_key else 0,
                      minimum=MIN_FLEET_KEY_CHARS)
        scheme = "https" if config.tls else "http"
        print(f"ok: would serve {served.revision} ({len(served.fleet.boxes)} boxes, {served.fleet.server_count} "
              f"servers) from {runtime.repo.where} branch {runtime.repo.branch} at {scheme}://{listen.bind}")
        return warnings
    finally:
        runtime.stop()


def run(args: argparse.Namespace) -> int:
    from llmfleet.logs import setup_logging

    setup_logging()
    try:
        config = load_config(args.config)
    except ConfigurationError as exc:
        raise CommandError(f"invalid config:\n{exc}", EXIT_INVALID) from None
    listen = _listen(args, config)
    for warning in check(config, listen):
        print(warning, file=sys.stderr)
    if args.check:
        return EXIT_OK
    serve(config, listen)
    return EXIT_OK


def serve(config: ControlPlaneConfig, listen: Listen) -> None:
    from flask import Flask

    from llmfleet.logs import setup_logging
    from llmfleet.server import httpserver
    from llmfleet.server.app import create_app
    from llmfleet.server.runtime import Runtime, replica_name, start_up

    runtimes: list[Runtime] = []

    def load_app() -> Flask:
        setup_logging(buffered=True)
        runtime = start_up(config, replica=replica_name(listen.port))
        runtimes.append(runtime)
        runtime.start_background()
        return create_app(runtime)

    def on_exit() -> None:  # write out buffered fetch records, close the database
        for runtime in runtimes:
            runtime.stop()

    httpserver.run(config, listen, load_app, on_exit)
