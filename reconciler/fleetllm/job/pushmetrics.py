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
Pushgateway cannot hang the Job: it goes out under fleetllm.adapters.outgoing's policy (an overall
deadline, no redirect followed, no proxy from the environment, https or loopback only). The URL may carry
a credential (in user:password@ or its path): logs and errors name only `scheme://host:port` and the
status, never the answer's reason phrase or body (a Pushgateway error may echo the request), and the URL,
its path, the password and the basic-auth value are scrubbed from any error text.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Callable
from pathlib import Path
from urllib.parse import SplitResult, unquote, urlsplit, urlunsplit

from prometheus_client import CollectorRegistry, push_to_gateway, write_to_textfile

from fleetllm.adapters.outgoing import fetch, hidden_forms, scrub
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


def _handler(user: str | None, password: str | None,
             secrets: list[str]) -> Callable[..., Callable[[], None]]:
    """prometheus_client's handler hook, sending through the outgoing policy; an error says only the status."""
    def handler(url: str, method: str, timeout: float | None, headers: list[tuple[str, str]],
                data: bytes) -> Callable[[], None]:
        def handle() -> None:
            sent = dict(headers)
            if user is not None:
                sent["Authorization"] = "Basic " + base64.b64encode(f"{user}:{password or ''}".encode()).decode()
            answer = fetch(method, url, what="the push", headers=sent, data=data,
                           timeout_s=timeout or 10.0, secrets=secrets)
            if answer.status >= 300:
                raise OSError(f"the Pushgateway answered HTTP {answer.status}")
        return handle

    return handler


def push_metrics(registry: CollectorRegistry, target: PushgatewayConfig) -> str | None:
    """PUT the registry to the Pushgateway as the group job=JOB, instance=target.instance. Returns None,
    or the failure (without any credential), which is also logged; never raises."""
    url = target.url.reveal()
    secrets = [url]
    try:
        parts = urlsplit(url)
        gateway, user, password = _split(parts)
        secrets += [segment for segment in parts.path.split("/") if len(segment) >= 8]
        if target.username is not None and target.password is not None:
            user, password = target.username.reveal(), target.password.reveal()
        if user is not None:
            secrets += [password or "", f"{user}:{password}"]
        secrets = list(hidden_forms(secrets))
        push_to_gateway(gateway, job=JOB, registry=registry, grouping_key={"instance": target.instance},
                        timeout=target.timeout_s, handler=_handler(user, password, secrets))
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
