"""`fleetllm rollout status|pause|resume|abort`: the staged rollout through the control plane's admin
API (GET /admin/rollout, POST /admin/rollout/ACTION).

The control plane is --url (or FLEETLLM_URL); the token is read from --token-file (or the environment:
FLEETLLM_ADMIN_TOKEN, else FLEETLLM_VIEWER_TOKEN for `status`), never taken on the command line; both
through the one admin-API client (fleetllm.adapters.admin_client). Exit 0 when done, 1 when the control
plane refused (e.g. nothing to pause), 2 when it could not be asked.
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

ACTIONS = ("status", "pause", "resume", "abort")
EXIT_REFUSED = 1  # the control plane refused it (a viewer's pause, nothing to pause); else exit 2
REFUSALS = frozenset({403, 404, 409})


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "rollout",
        description="The staged rollout through the control plane's admin API: status shows the target, "
                    "the waves and each agent box's release and why it waits; pause stops releasing boxes; "
                    "resume goes on (a halted rollout retries its halted box); abort rolls released but "
                    "unconverged boxes back to their last good revision. The next reconcile pass applies a "
                    "request.")
    parser.add_argument("action", choices=ACTIONS)
    parser.add_argument("--url", metavar="URL", help="the control plane, e.g. https://fleet.example.org "
                        f"(default: {URL_ENV})")
    parser.add_argument("--token-file", metavar="FILE", help="a file holding an operator or admin token (a viewer "
                        f"token does for status); default: {TOKEN_ENV}, else {VIEWER_TOKEN_ENV}")
    parser.add_argument("--ca-file", metavar="FILE", help="CA certificates to verify the control plane's TLS with")
    parser.add_argument("--format", choices=("text", "json"), default="text")
    parser.add_argument("--timeout", type=float, default=15.0, metavar="SECONDS")
    parser.set_defaults(run=run)


def client(args: argparse.Namespace) -> AdminClient:
    env = dict(os.environ)
    names = (TOKEN_ENV,) if args.action != "status" else (TOKEN_ENV, VIEWER_TOKEN_ENV)
    return AdminClient(control_plane_url(args.url, env), admin_token(args.token_file, env, names), args.ca_file,
                       args.timeout)


def call(args: argparse.Namespace) -> Any:
    """The control plane's answer; a refusal exits 1 when it says no to the request itself (a viewer's
    action, nothing to pause), 2 when the request could not be made as asked."""
    api = client(args)
    method, path = ("GET", "/admin/rollout") if args.action == "status" else ("POST", f"/admin/rollout/{args.action}")
    try:
        return api.call(method, path)
    except AdminRefused as exc:
        raise CommandError(str(exc), EXIT_REFUSED if exc.status in REFUSALS else exc.exit_code) from None


def run(args: argparse.Namespace) -> int:
    body = call(args)
    if args.format == "json":
        print(json.dumps(body, indent=2))
        return EXIT_OK
    assert isinstance(body, dict)
    if args.action != "status":
        print(f"{args.action} requested by {body.get('by')}: {body.get('note')}")
    rollout = body.get("rollout")
    print(status_text(rollout if isinstance(rollout, dict) else None))
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
    return "\n".join(lines)
