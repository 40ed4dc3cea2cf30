"""`fleetllm api-key --host H --port P`: print the bearer one vLLM server really uses (for boxes launched by
hand): the derived bearer, or for a legacy pair (fleet.yaml legacy_servers) the shared legacy key."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from fleetllm.cli.common import EXIT_OK, CommandError, eprint, load_validation, require_valid
from fleetllm.core.fleet.bearer import LEGACY_KEY_ENV, SaltError, load_legacy_key, load_salt


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 < port < 65536:
        raise argparse.ArgumentTypeError(f"{port} is outside 1..65535")
    return port


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "api-key",
        description="Print the bearer a vLLM server on HOST:PORT requires: derived from the salt (HMAC; the salt "
                    "is never printed), or for a legacy pair of the fleet repository the shared legacy key.")
    parser.add_argument("--host", required=True, help="the box name (public IP or provider id)")
    parser.add_argument("--port", required=True, type=_port, help="the container listen port")
    parser.add_argument("--salt-file", metavar="FILE",
                        help="file holding the bearer salt (default: $FLEETLLM_VLLM_API_SALT)")
    parser.add_argument("--legacy-key-file", metavar="FILE",
                        help=f"file holding the shared legacy bearer (default: ${LEGACY_KEY_ENV}), for a legacy pair")
    parser.add_argument("--repo", metavar="DIR",
                        help="the fleet repository, to tell a legacy pair (default: the current directory when it "
                             "has a fleet.yaml)")
    parser.add_argument("--rev", metavar="REV", help="read the fleet at this git commit")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    repo = args.repo or ("." if Path("fleet.yaml").is_file() else None)
    try:
        if repo is not None:
            validation = load_validation(repo, args.rev)
            require_valid(validation)
            assert validation.fleet is not None
            if validation.fleet.settings.is_legacy(args.host, args.port):
                key = load_legacy_key(args.legacy_key_file)
                if key is None:
                    raise CommandError(f"{args.host}:{args.port} is a legacy pair (fleet.yaml legacy_servers): its "
                                       f"bearer is the shared legacy key; pass --legacy-key-file FILE or set "
                                       f"{LEGACY_KEY_ENV}")
                print(key)
                return EXIT_OK
        salt = load_salt(args.salt_file)
        bearer = salt.derive(args.host, args.port)
    except (SaltError, ValueError) as exc:
        raise CommandError(str(exc)) from None
    if repo is None:
        eprint("fleetllm api-key: no fleet repository (--repo DIR), so a legacy pair cannot be told apart: "
               "this is the derived bearer; a legacy pair (fleet.yaml legacy_servers) uses the shared legacy key")
    if (warning := salt.warning()) is not None:
        eprint(f"fleetllm api-key: warning: {warning}")
    print(bearer)
    return EXIT_OK
