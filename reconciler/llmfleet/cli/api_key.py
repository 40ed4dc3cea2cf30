"""`llmfleet api-key --host H --port P`: print one server's vLLM bearer (for boxes launched by hand)."""

from __future__ import annotations

import argparse
from typing import Any

from llmfleet.cli.common import EXIT_OK, CommandError, eprint
from llmfleet.core.fleet.bearer import SaltError, load_salt


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
        "api-key", help="print the vLLM bearer of one server",
        description="Derive the bearer a vLLM server on HOST:PORT requires (HMAC of the salt; the salt is "
                    "never printed).")
    parser.add_argument("--host", required=True, help="the box name (public IP or provider id)")
    parser.add_argument("--port", required=True, type=_port, help="the container listen port")
    parser.add_argument("--salt-file", metavar="FILE",
                        help="file holding the bearer salt (default: $LLMFLEET_VLLM_API_SALT)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        salt = load_salt(args.salt_file)
        bearer = salt.derive(args.host, args.port)
    except (SaltError, ValueError) as exc:
        raise CommandError(str(exc)) from None
    if (warning := salt.warning()) is not None:
        eprint(f"llmfleet api-key: warning: {warning}")
    print(bearer)
    return EXIT_OK

