"""`fleetllm sync | suspend | resume | pin REV | unpin | control`: the operator controls of the whole
fleet, without a commit, through the control plane's admin API (fleetllm.server.control_api) with an
operator or admin token (fleetllm.adapters.admin_client: --url / $FLEETLLM_URL, --token-file /
$FLEETLLM_ADMIN_TOKEN).

    sync              re-read the branch and have the reconcile loop run a pass within seconds; with
                      --wait, then wait for the rollout of the revision served (fleetllm.cli.waiting:
                      exit 0 converged, 1 halted, aborted or superseded, 2 at --timeout)
    suspend           passes keep observing and recording verdicts, and change nothing (no LiteLLM write)
    resume            end the suspension
    pin REV           serve that valid commit of the tracked branch to every box, until unpinned
    unpin             serve the newest valid commit again
    control           show what is in force and the audit trail

Every action is recorded with who (the token's fingerprint), when and --reason.
"""

from __future__ import annotations

import argparse
import json
import os
from datetime import UTC, datetime
from typing import Any

from fleetllm.adapters.admin_client import TOKEN_ENV, URL_ENV, AdminClient, admin_token, control_plane_url
from fleetllm.cli.common import EXIT_OK, CommandError
from fleetllm.cli.waiting import DEFAULT_INTERVAL_S, DEFAULT_TIMEOUT_S, MIN_INTERVAL_S, wait_for_rollout

COMMANDS = {
    "sync": ("ask for a reconcile pass now (and re-read the tracked branch)", "/admin/sync"),
    "suspend": ("suspend the fleet: passes observe and record, and change nothing", "/admin/suspend"),
    "resume": ("end a suspension", "/admin/resume"),
    "pin": ("serve one valid revision of the tracked branch to every box, until unpinned", "/admin/pin"),
    "unpin": ("remove the pin: boxes get the newest valid revision again", "/admin/unpin"),
    "control": ("show the fleet's controls in force (suspension, pin, sync) and their audit trail", "/admin/control"),
}


def add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", metavar="URL", help=f"the control plane, https://HOST:PORT (default: ${URL_ENV})")
    parser.add_argument("--token-file", metavar="FILE",
                        help=f"file holding an operator or admin token (default: ${TOKEN_ENV}; never the token "
                             "itself)")
    parser.add_argument("--ca-file", metavar="FILE", help="CA certificates to verify the control plane's TLS with")
    parser.add_argument("--format", choices=("text", "json"), default="text")


def register(subparsers: Any) -> None:
    for name, (summary, _) in COMMANDS.items():
        parser: argparse.ArgumentParser = subparsers.add_parser(name, description=summary + ".")
        if name == "pin":
            parser.add_argument("revision", metavar="REV",
                                help="a commit of the tracked branch's history that validates (id, prefix, tag)")
        if name != "control":
            parser.add_argument("--reason", default="", metavar="TEXT", help="why (kept in the audit trail)")
        if name == "sync":
            parser.add_argument("--wait", action="store_true",
                                help="then wait for the rollout of the revision the control plane serves, printing "
                                     "its progress: exit 0 when it converged, 1 when it halted, was aborted or was "
                                     "superseded, 2 at --timeout (for CI after a merge)")
            parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
                                help=f"with --wait: how long to wait (default {DEFAULT_TIMEOUT_S:g})")
            parser.add_argument("--interval", type=float, default=DEFAULT_INTERVAL_S, metavar="SECONDS",
                                help=f"with --wait: seconds between looks (default {DEFAULT_INTERVAL_S:g})")
        add_connection_arguments(parser)
        parser.set_defaults(run=run)


def client(args: argparse.Namespace) -> AdminClient:
    env = dict(os.environ)
    return AdminClient(control_plane_url(args.url, env), admin_token(args.token_file, env), args.ca_file)


def run(args: argparse.Namespace) -> int:
    waiting = args.command == "sync" and args.wait
    if waiting and (args.timeout <= 0 or args.interval < MIN_INTERVAL_S):
        raise CommandError(f"--timeout must be above 0 and --interval at least {MIN_INTERVAL_S:g} seconds")
    api = client(args)
    path = COMMANDS[args.command][1]
    if args.command == "control":
        answer = api.call("GET", path)
        state = answer
    else:
        body: dict[str, Any] = {"reason": args.reason}
        if args.command == "pin":
            body["revision"] = args.revision
        answer = api.call("POST", path, body)
        state = answer.get("control", {}) if isinstance(answer, dict) else {}
    if args.format == "json":
        print(json.dumps(answer, indent=2), flush=True)
        return wait_after_sync(api, state, args) if waiting else EXIT_OK
    if args.command != "control" and isinstance(answer, dict):
        print(sentence(args.command, answer))
    print(describe(state))
    if args.command == "control":
        for event in state.get("audit", []) if isinstance(state, dict) else []:
            revision = f" {event['revision'][:12]}" if event.get("revision") else ""
            reason = f": {event['reason']}" if event.get("reason") else ""
            print(f"  {when(event['at'])}  {event['action']}{revision} by {event['actor']}{reason}")
    return wait_after_sync(api, state, args) if waiting else EXIT_OK


def wait_after_sync(api: AdminClient, state: Any, args: argparse.Namespace) -> int:
    """`sync --wait`: the rollout of the revision the control plane serves after the sync's re-read (the
    pinned one under a pin), which the pass the sync asked for rolls out."""
    revision = state.get("served_revision") if isinstance(state, dict) else None
    if not isinstance(revision, str) or not revision:
        raise CommandError("the control plane serves no revision yet (its repository could not be read): nothing "
                           "to wait for; see its /health")
    print(f"waiting for the rollout of {revision[:12]} (--timeout {args.timeout:g} s)", flush=True)
    return wait_for_rollout(api, revision, timeout_s=args.timeout, interval_s=args.interval,
                            say=lambda line: print(line, flush=True))


def when(ts: float | None) -> str:
    return "-" if ts is None else datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def sentence(command: str, answer: dict[str, Any]) -> str:
    status = answer.get("status", "")
    if command == "sync":
        return "sync requested: the reconcile loop runs a pass within seconds"
    if command == "pin" and status == "pinned":
        return f"pinned to {answer.get('revision')}: every box is served it until `fleetllm unpin`"
    return str(status)


def describe(state: Any) -> str:
    if not isinstance(state, dict):
        return ""
    lines = []
    suspended, pin = state.get("suspended"), state.get("pin")
    if suspended:
        lines.append(f"SUSPENDED since {when(suspended['at'])} by {suspended['actor']}"
                     + (f": {suspended['reason']}" if suspended.get("reason") else ""))
    else:
        lines.append("not suspended")
    if pin:
        lines.append(f"PINNED to {pin['revision']} since {when(pin['at'])} by {pin['actor']}"
                     + (f": {pin['reason']}" if pin.get("reason") else ""))
    else:
        lines.append("not pinned")
    if state.get("sync_requested"):
        lines.append("a sync request waits for the reconcile loop")
    lines.append(f"served revision: {state.get('served_revision')}")
    return "\n".join(lines)
