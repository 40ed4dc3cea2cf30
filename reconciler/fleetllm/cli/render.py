"""`fleetllm render HOST`: print the JSON a box gets from GET /vllm/config."""

from __future__ import annotations

import argparse
import json
from typing import Any

from fleetllm.cli.common import (
    EXIT_INVALID,
    EXIT_OK,
    CommandError,
    add_repo_arguments,
    load_validation,
    require_valid,
)
from fleetllm.core.fleet.bearer import SaltError, load_legacy_key, load_salt
from fleetllm.core.fleet.render import Bearers, RenderError, render_box


def add_secret_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--salt-file", metavar="FILE",
                        help="file holding the bearer salt (default: $FLEETLLM_VLLM_API_SALT)")
    parser.add_argument("--legacy-key-file", metavar="FILE",
                        help="file holding the shared legacy bearer (default: $FLEETLLM_LEGACY_API_KEY)")


def bearers_from(args: argparse.Namespace) -> Bearers:
    try:
        return Bearers(load_salt(args.salt_file), load_legacy_key(args.legacy_key_file))
    except SaltError as exc:
        raise CommandError(str(exc)) from None


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "render", description="Print the JSON that GET /vllm/config serves to HOST, bearers included.")
    parser.add_argument("host", metavar="HOST", help="the box name, as in placement.yaml")
    add_repo_arguments(parser)
    add_secret_arguments(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    validation = load_validation(args.repo, args.rev)
    require_valid(validation)
    assert validation.fleet is not None
    bearers = bearers_from(args)
    try:
        document = render_box(validation.fleet, args.host, bearers)
    except RenderError as exc:
        raise CommandError(str(exc), EXIT_INVALID) from None
    print(json.dumps(document, indent=2))
    return EXIT_OK
