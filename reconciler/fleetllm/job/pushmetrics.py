"""Handing a batch pass's metrics over when it ends: to a Prometheus Pushgateway and/or to a file for
node_exporter's textfile collector.

`fleetllm reconcile --once` (a CronJob, a systemd timer) ends with its pass, so nothing can scrape it: its
registry is pushed instead (reconcile.pushgateway) or written to a textfile (reconcile.metrics_file,
--metrics-file). Both use prometheus_client's own functions, the well-kept reference of either protocol:
`push_to_gateway` (a PUT of the group job="fleetllm_reconcile", instance=<instance>, which replaces the
previous pass's series, so a model gone from the fleet loses its series) and `write_to_textfile` (a
temporary file renamed over the target: node_exporter never reads half a file).

Neither may change the pass's outcome: a failure is logged (`metrics_push_failed`, `metrics_file_failed`)
and returned, and the exit status stays the pass's. The push has a short timeout (timeout_s), so a dead
Pushgateway cannot hang the Job. The URL may carry a credential: logs and errors name only
`scheme://host:port`, and the URL and the password are scrubbed from any error text.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from urllib.parse import SplitResult, unquote, urlsplit, urlunsplit

from prometheus_client import CollectorRegistry, push_to_gateway, write_to_textfile
from prometheus_client.exposition import basic_auth_handler, default_handler

from fleetllm.adapters.http import scrub
from fleetllm.logs import get_logger, log_event
from fleetllm.settings import PushgatewayConfig

__all__ = ["JOB", "push_metrics", "write_metrics_file"]

LOG = get_logger("reconcile")
JOB = "fleetllm_reconcile"  # the Pushgateway's job label of every push (the alert rules do not need it)


def _split(parts: SplitResult) -> tuple[str, str | None, str | None]:
    """The URL without user:password@ (urllib would not send them), and the two for basic auth."""
    if parts.username is None:
        return urlunsplit(parts), None, None
    netloc = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=netloc)), unquote(parts.username), unquote(parts.password or "")


def _with_basic_auth(user: str, password: str) -> Callable[..., Callable[[], None]]:
    def handler(url: str, method: str, timeout: float | None, headers: list[tuple[str, str]],
                data: bytes) -> Callable[[], None]:
        return basic_auth_handler(url, method, timeout, headers, data, user, password)

    return handler


def push_metrics(registry: CollectorRegistry, target: PushgatewayConfig) -> str | None:
    """PUT the registry to the Pushgateway as the group job=JOB, instance=target.instance. Returns None,
    or the failure (without any credential), which is also logged; never raises."""
    url = target.url.reveal()
    secrets = [url]
    try:
        gateway, user, password = _split(urlsplit(url))
        if target.username is not None and target.password is not None:
            user, password = target.username.reveal(), target.password.reveal()
        handler: Callable[..., Callable[[], None]] = default_handler
        if user is not None:
            secrets += [password or "", f"{user}:{password}"]
            handler = _with_basic_auth(user, password or "")
        push_to_gateway(gateway, job=JOB, registry=registry, grouping_key={"instance": target.instance},
                        timeout=target.timeout_s, handler=handler)
    except Exception as exc:  # any failure of the push: the pass's outcome stands
        error = scrub(f"{type(exc).__name__}: {exc}", secrets)
        log_event(LOG, "metrics_push_failed", logging.WARNING, pushgateway=target.where, job=JOB,
                  instance=target.instance, error=error,
                  note="the pass's outcome and exit status are unchanged; the group keeps the previous push")
        return error
    log_event(LOG, "metrics_pushed", logging.DEBUG, pushgateway=target.where, job=JOB, instance=target.instance)
    return None


def write_metrics_file(registry: CollectorRegistry, path: str | Path) -> str | None:
    """Write the registry in the text format to `path` atomically. Returns None, or the failure (logged);
    never raises."""
    try:
        write_to_textfile(str(path), registry)
    except Exception as exc:  # a full disk, a missing directory: the outcome stands
        error = f"{type(exc).__name__}: {exc}"
        log_event(LOG, "metrics_file_failed", logging.WARNING, path=str(path), error=error,
                  note="the pass's outcome and exit status are unchanged")
        return error
    return None
