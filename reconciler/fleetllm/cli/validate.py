"""`fleetllm validate [DIR] [--rev REV] [--format text|json|github]`: exit 0 valid, 1 invalid, 2 error."""

from __future__ import annotations

import argparse
import os
from typing import Any

from fleetllm.cli.common import EXIT_INVALID, EXIT_OK, add_repo_arguments, load_validation
from fleetllm.core.fleet.diagnostics import format_github, format_json, format_text


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "validate",
        description="Validate a fleet repository's working tree, or one of its commits with --rev. "
                    "Every problem is reported at once as file:line:col: message [rule]. "
                    "Exit 0 valid, 1 invalid, 2 usage or I/O error.")
    add_repo_arguments(parser, positional=True)
    default = "github" if os.environ.get("GITHUB_ACTIONS") == "true" else "text"
    parser.add_argument("--format", choices=("text", "json", "github"), default=default,
                        help="output format (default: github inside GitHub Actions, else text)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    validation = load_validation(args.repo, args.rev)
    if args.format == "json":
        print(format_json(validation.diagnostics, revision=validation.revision))
    elif args.format == "github":
        annotations = format_github(validation.diagnostics)
        if annotations:
            print(annotations)
        print(_summary(args.repo, validation))
    else:
        if validation.diagnostics:
            print(format_text(validation.diagnostics))
        print(_summary(args.repo, validation))
    return EXIT_OK if validation.valid else EXIT_INVALID


def _summary(repo: str, validation: Any) -> str:
    fleet = validation.fleet
    if fleet is None:
        return f"{repo}: invalid at {validation.revision}"
    return (f"{repo}: valid at {validation.revision} ({len(fleet.boxes)} boxes, {fleet.server_count} servers, "
            f"{len(fleet.recipes)} models)")
