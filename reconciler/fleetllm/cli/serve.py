"""`fleetllm serve --config FILE [--listen HOST:PORT] [--insecure-http] [--check]`: the control plane.

Runs the Flask app in process behind its own HTTP server on llhttp (one event loop reads every connection,
a pool of `server.threads` runs complete requests: reconciler/fleetllm/server/httpserver.py), HTTPS when the
config has a certificate and key. Without TLS it only listens on loopback addresses unless --insecure-http.
`--check` runs the whole start-up path (config, secrets, TLS files, the repository and its last valid
commit, every box rendered, the installer built) and exits 0, or 1 with the reason, without binding a
port. It writes nothing to the state store and logs nothing: the store is only looked at (an SQLite
file read-only, or the folder it would be created in; a PostgreSQL server connected to), and the
start-up path runs on a throwaway in-memory store.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from typing import TYPE_CHECKING, Any

from fleetllm.cli.common import CONFIG_SEARCH, EXIT_INVALID, EXIT_OK, EXIT_USAGE, CommandError, find_config
from fleetllm.errors import ConfigurationError, SourceError, StateError
from fleetllm.logs import get_logger, log_event, resolve_level
from fleetllm_contract.logfmt import add_level_argument

if TYPE_CHECKING:  # the settings (and the state store, the web server) are imported when the command runs
    from fleetllm.settings import ControlPlaneConfig, Listen


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "serve", description="Serve every box its JSON from the last valid commit of the tracked branch.")
    parser.add_argument("--config", metavar="FILE",
                        help=f"the control plane's config file (default: {CONFIG_SEARCH})")
    parser.add_argument("--listen", metavar="HOST:PORT", help="override the config's listen address")
    parser.add_argument("--insecure-http", action="store_true",
                        help="allow plain HTTP on a non-loopback address (boxes would send the fleet key in clear)")
    parser.add_argument("--check", action="store_true",
                        help="run the whole start-up path without binding a port; exit 0 if it would serve")
    add_level_argument(parser)
    parser.set_defaults(run=run)


def _listen(args: argparse.Namespace, config: ControlPlaneConfig) -> Listen:
    import ssl

    from fleetllm.settings import Listen

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


def look_at_state(config: ControlPlaneConfig) -> str:
    """Whether the state store can be used, without writing to it: what `serve` would open."""
    from fleetllm.adapters.state import look_at_store

    try:
        return look_at_store(config.state.url, config.state.base, config.state.password)
    except StateError as exc:
        raise CommandError(str(exc), EXIT_INVALID) from None


def check(config: ControlPlaneConfig, listen: Listen, *, dry: bool = False) -> tuple[str, list[str]]:
    """The start-up path once, then closed again. Returns the verdict ("ok: would serve ...") and the
    warnings; raises CommandError on failure. `dry` (serve --check): the real store is only looked at,
    the start-up path runs on a memory store."""
    from fleetllm.server.runtime import start_up
    from fleetllm.settings import MIN_FLEET_KEY_CHARS, fleet_key_warning, metrics_token_warning

    state = look_at_state(config) if dry else None
    trial = dataclasses.replace(config, state=dataclasses.replace(config.state, url="sqlite:///:memory:")) if dry \
        else config
    trial = dataclasses.replace(trial, notifications=dataclasses.replace(config.notifications, targets=()))  # the
    # check sends nothing (and waits for no receiver at its stop): the serving runtime notifies
    try:
        runtime = start_up(trial)
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
        if (public_metrics := metrics_token_warning(config, listen)) is not None:  # serving: a start-up warning
            warnings.append(public_metrics)
        scheme = "https" if config.tls else "http"
        verdict = (f"ok: would serve {served.revision} ({len(served.fleet.boxes)} boxes, {served.fleet.server_count} "
                   f"servers) from {runtime.repo.where} branch {runtime.repo.branch} at {scheme}://{listen.bind}"
                   + (f"; state store: {state}" if state else ""))
        return verdict, warnings
    finally:
        runtime.stop()


def run(args: argparse.Namespace) -> int:
    from fleetllm.logs import setup_logging

    if args.check:  # the verdict only: no log line before (or after) it; warnings on stderr
        logging.disable(logging.CRITICAL)
        try:
            verdict, warnings = check(*_config_and_listen(args), dry=True)
            print(verdict)
            for warning in warnings:
                print(warning, file=sys.stderr)
        finally:
            logging.disable(logging.NOTSET)
        return EXIT_OK
    config, listen = _config_and_listen(args)
    level = resolve_level(args.log_level, default=config.log_level)  # the flag, else the environment or the file
    setup_logging(level=level)
    verdict, warnings = check(config, listen)  # serving: the log says it, one JSON line each
    log_event(get_logger("serve"), "start-up checked", verdict=verdict)
    for warning in warnings:
        log_event(get_logger("serve"), "start-up warning", logging.WARNING, warning=warning)
    serve(config, listen, level)
    return EXIT_OK


def _config_and_listen(args: argparse.Namespace) -> tuple[ControlPlaneConfig, Listen]:
    from fleetllm.settings import RECONCILE_ONLY, load_config

    try:
        path = find_config(args.config)
    except ConfigurationError as exc:
        raise CommandError(str(exc), EXIT_INVALID) from None
    if path is None:
        raise CommandError(f"no config file: pass --config FILE, or put it where serve looks: {CONFIG_SEARCH}",
                           EXIT_USAGE)
    try:
        config = load_config(path, unread=RECONCILE_ONLY)  # its unit or Deployment has no push credential
    except ConfigurationError as exc:
        raise CommandError(f"invalid config:\n{exc}", EXIT_INVALID) from None
    return config, _listen(args, config)


def serve(config: ControlPlaneConfig, listen: Listen, level: int = logging.INFO) -> None:
    from flask import Flask

    from fleetllm.logs import setup_logging
    from fleetllm.server import httpserver
    from fleetllm.server.app import create_app
    from fleetllm.server.runtime import Runtime, replica_name, start_up

    runtimes: list[Runtime] = []

    def load_app() -> Flask:
        setup_logging(level=level, buffered=True)
        runtime = start_up(config, replica=replica_name(listen.port))
        runtimes.append(runtime)
        runtime.start_background()
        return create_app(runtime)

    def on_exit() -> None:  # write out buffered fetch records, close the database
        for runtime in runtimes:
            runtime.stop()

    httpserver.run(config, listen, load_app, on_exit)
