"""`fleetllm rollout status|pause|resume|abort|wait|forget`: the staged rollout through the control plane's
admin API (GET /admin/rollout, POST /admin/rollout/ACTION, POST /admin/rollout/forget), with the one admin-API
client (fleetllm.adapters.admin_client). `forget BOX` retires a box that left the placement at once (one that
vanished without reporting its empty box): the rollout stops waiting for it, and it is answered 404.

The control plane is --url (or FLEETLLM_URL: https, or http on a loopback address); the token is read
from --token-file (or the environment: FLEETLLM_ADMIN_TOKEN, else FLEETLLM_VIEWER_TOKEN for `status`
and `wait`), never taken on the command line. Exit 0 when done, 1 when the control plane refused (e.g.
nothing to pause), 2 when it could not be asked. `wait [REVISION]` (fleetllm.cli.waiting) exits 0 when
the rollout converged, 1 when it halted, was aborted or was superseded, 2 at --timeout.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from fleetllm.adapters.admin_client import (
    TOKEN_ENV,
    URL_ENV,
    VIEWER_TOKEN_ENV,
    AdminClient,
    AdminRefused,
    admin_token,
    control_plane_url,
)
from fleetllm.cli.common import EXIT_OK, CommandError
from fleetllm.cli.waiting import (
    DEFAULT_INTERVAL_S,
    DEFAULT_TIMEOUT_S,
    MIN_INTERVAL_S,
    revision_argument,
    wait_for_rollout,
)

ACTIONS = ("status", "pause", "resume", "abort", "wait", "forget")
READING = ("status", "wait")  # a viewer token does
EXIT_REFUSED, EXIT_UNREACHABLE = 1, 2  # refused: the control plane said no to the request itself
REFUSALS = frozenset({403, 404, 409})  # a viewer's action, nothing to pause; another 4xx: exit 2
REQUEST_TIMEOUT_S = 15.0
MAX_BOX_CHARS = 256


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "rollout",
        description="The staged rollout through the control plane's admin API: status shows the target, "
                    "the waves and each agent box's release and why it waits; pause stops releasing boxes; "
                    "resume goes on (a halted rollout retries its halted box); abort rolls released but "
                    "unconverged boxes back to their last good revision. The next reconcile pass applies a "
                    "request. wait [REVISION] waits for the rollout of REVISION (default: the current one), "
                    "printing its progress, and exits 0 when it converged, 1 when it halted, was aborted or "
                    "was superseded by a newer revision, 2 at --timeout: for CI after a merge. forget BOX retires a "
                    "box that left the placement at once (one that vanished without reporting): its release is "
                    "dropped and it is answered 404; audited.")
    parser.add_argument("action", choices=ACTIONS)
    parser.add_argument("revision", nargs="?", metavar="REVISION",
                        help="wait: the commit whose rollout to wait for (its SHA or a prefix, e.g. $GITHUB_SHA); "
                             "default: the rollout under way. forget: the BOX to forget (required)")
    parser.add_argument("--url", metavar="URL", help=f"the control plane, e.g. https://fleet.example.org "
                        f"(default: ${URL_ENV}; http only on a loopback address)")
    parser.add_argument("--token-file", metavar="FILE", help=f"a file holding an operator or admin token (a viewer "
                        f"token does for status and wait); default: ${TOKEN_ENV}, else ${VIEWER_TOKEN_ENV}")
    parser.add_argument("--ca-file", metavar="FILE", help="CA certificates to verify the control plane's TLS with")
    parser.add_argument("--format", choices=("text", "json"), default="text")
    parser.add_argument("--timeout", type=float, metavar="SECONDS",
                        help=f"how long the command may take: wait's whole wait (default {DEFAULT_TIMEOUT_S:g}), "
                             f"else the one request (default {REQUEST_TIMEOUT_S:g})")
    parser.add_argument("--interval", type=float, default=DEFAULT_INTERVAL_S, metavar="SECONDS",
                        help=f"wait: seconds between looks at the rollout (default {DEFAULT_INTERVAL_S:g})")
    parser.set_defaults(run=run)


def client(args: argparse.Namespace, names: tuple[str, ...], timeout_s: float) -> AdminClient:
    env = dict(os.environ)
    return AdminClient(control_plane_url(args.url, env), admin_token(args.token_file, env, names), args.ca_file,
                       timeout_s)


def check_timing(args: argparse.Namespace) -> None:
    if args.timeout is not None and args.timeout <= 0:
        raise CommandError(f"--timeout {args.timeout:g}: give a number of seconds above 0")
    if args.interval < MIN_INTERVAL_S:
        raise CommandError(f"--interval {args.interval:g}: give at least {MIN_INTERVAL_S:g} seconds")


def run(args: argparse.Namespace) -> int:
    check_timing(args)
    if args.action == "forget":
        return forget(args)
    if args.revision is not None and args.action != "wait":
        raise CommandError(f"a REVISION goes with `fleetllm rollout wait` only, not {args.action}")
    names = (TOKEN_ENV, VIEWER_TOKEN_ENV) if args.action in READING else (TOKEN_ENV,)
    if args.action == "wait":
        revision = revision_argument(args.revision, "REVISION") if args.revision is not None else None
        api = client(args, names, REQUEST_TIMEOUT_S)
        return wait_for_rollout(api, revision, timeout_s=args.timeout or DEFAULT_TIMEOUT_S,
                                interval_s=args.interval, say=lambda line: print(line, flush=True))
    api = client(args, names, args.timeout or REQUEST_TIMEOUT_S)
    try:
        body = (api.call("GET", "/admin/rollout") if args.action == "status"
                else api.call("POST", f"/admin/rollout/{args.action}"))
    except AdminRefused as exc:
        raise CommandError(str(exc), EXIT_REFUSED if exc.status in REFUSALS else exc.exit_code) from None
    if args.format == "json":
        print(json.dumps(body, indent=2))
        return EXIT_OK
    if not isinstance(body, dict):
        raise CommandError(f"GET /admin/rollout answered {type(body).__name__}, not the rollout view",
                           EXIT_UNREACHABLE)
    if args.action != "status":
        print(f"{args.action} requested by {body.get('by')}: {body.get('note')}")
    rollout = body.get("rollout")
    print(status_text(rollout if isinstance(rollout, dict) else None))
    return EXIT_OK


def forget(args: argparse.Namespace) -> int:
    """`fleetllm rollout forget BOX`: POST /admin/rollout/forget."""
    box = args.revision
    if not box or box.startswith("-") or len(box) > MAX_BOX_CHARS:
        raise CommandError("give the BOX to forget: `fleetllm rollout forget BOX` (its name in placement.yaml)")
    api = client(args, (TOKEN_ENV,), args.timeout or REQUEST_TIMEOUT_S)
    try:
        body = api.call("POST", "/admin/rollout/forget", {"box": box})
    except AdminRefused as exc:
        raise CommandError(str(exc), EXIT_REFUSED if exc.status in REFUSALS else exc.exit_code) from None
    if args.format == "json":
        print(json.dumps(body, indent=2))
    else:
        record = body.get("retirement") if isinstance(body, dict) else None
        revision = str(record.get("revision", ""))[:12] if isinstance(record, dict) else ""
        print(f"box {box} forgotten by {body.get('by') if isinstance(body, dict) else '?'}: retired "
              f"(left the placement at {revision or 'an unknown revision'}); GET /vllm/config answers it 404")
    return EXIT_OK


def status_text(rollout: dict[str, Any] | None) -> str:
    if rollout is None:
        return "no rollout yet: the reconciler starts one at its first pass with the state store"
    lines = [f"rollout of {str(rollout['target'])[:12]}: {rollout['state']}, {rollout['waves']} wave(s)"]
    if rollout.get("reason"):
        lines.append(f"  reason: {rollout['reason']}")
    requested = rollout.get("requested")
    if isinstance(requested, dict):
        lines.append(f"  requested: {requested.get('request')} by {requested.get('by')} (the next pass applies it)")
    boxes = rollout.get("boxes") or {}
    width = max((len(b) for b in boxes), default=3)
    for box, release in boxes.items():
        applied = release.get("applied") or "-"
        lines.append(f"  {box:<{width}}  {release['state']:<9} released {str(release['released'])[:12]:<12} "
                     f"applied {str(applied)[:12]:<12} wave {release['wave']}"
                     + (f"  {release['why']}" if release.get("why") else ""))
    for box, record in (rollout.get("retirements") or {}).items():
        lines.append(f"  {box:<{width}}  {record['state']:<9} left the placement at {str(record['revision'])[:12]}"
                     + (f"  {record['reason']}" if record.get("reason") else ""))
    return "\n".join(lines)
