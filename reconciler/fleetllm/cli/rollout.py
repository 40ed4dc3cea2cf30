"""`fleetllm rollout status|pause|resume|abort`: the staged rollout through the control plane's admin
API (GET /admin/rollout, POST /admin/rollout/ACTION).

The control plane is --url (or FLEETLLM_URL); the token is read from --token-file (or the environment:
FLEETLLM_ADMIN_TOKEN, else FLEETLLM_VIEWER_TOKEN for `status`), never taken on the command line. Exit 0
when done, 1 when the control plane refused (e.g. nothing to pause), 2 when it could not be asked.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from pathlib import Path
from typing import Any

from fleetllm.cli.common import EXIT_OK, CommandError
from fleetllm.core.fleet.jsonvalue import JSON

ACTIONS = ("status", "pause", "resume", "abort")
EXIT_REFUSED, EXIT_UNREACHABLE = 1, 2


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
                        "(default: FLEETLLM_URL)")
    parser.add_argument("--token-file", metavar="FILE", help="a file holding an operator or admin token (a viewer "
                        "token does for status); default: FLEETLLM_ADMIN_TOKEN, else FLEETLLM_VIEWER_TOKEN")
    parser.add_argument("--format", choices=("text", "json"), default="text")
    parser.add_argument("--timeout", type=float, default=15.0, metavar="SECONDS")
    parser.set_defaults(run=run)


def token(args: argparse.Namespace) -> str:
    if args.token_file:
        try:
            value = Path(args.token_file).read_text().strip()
        except OSError as exc:
            raise CommandError(f"--token-file {args.token_file}: {exc.strerror}", EXIT_UNREACHABLE) from None
        if not value:
            raise CommandError(f"--token-file {args.token_file} is empty", EXIT_UNREACHABLE)
        return value
    names = ("FLEETLLM_ADMIN_TOKEN",) if args.action != "status" else ("FLEETLLM_ADMIN_TOKEN", "FLEETLLM_VIEWER_TOKEN")
    for name in names:
        if os.environ.get(name, "").strip():
            return os.environ[name].strip()
    raise CommandError("no token: pass --token-file FILE or set " + " or ".join(names), EXIT_UNREACHABLE)


def base_url(args: argparse.Namespace) -> str:
    url = (args.url or os.environ.get("FLEETLLM_URL", "")).rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise CommandError("no control plane: pass --url https://HOST or set FLEETLLM_URL", EXIT_UNREACHABLE)
    return url


async def call(args: argparse.Namespace) -> JSON:
    import aiohttp

    from fleetllm.adapters.http import request_json

    url, bearer = base_url(args), token(args)
    method, path = ("GET", "/admin/rollout") if args.action == "status" else ("POST", f"/admin/rollout/{args.action}")
    async with aiohttp.ClientSession() as session:
        _, body = await request_json(session, method, url + path, what=f"{method} {path}",
                                     headers={"Authorization": f"Bearer {bearer}"}, timeout_s=args.timeout,
                                     ok=frozenset({200, 202}), secrets=(bearer,))
    return body


def run(args: argparse.Namespace) -> int:
    from fleetllm.adapters.http import HttpError

    try:
        body = asyncio.run(call(args))
    except HttpError as exc:
        refused = exc.status in (403, 404, 409)
        raise CommandError(str(exc), EXIT_REFUSED if refused else EXIT_UNREACHABLE) from None
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
