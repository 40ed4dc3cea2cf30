"""`fleetllm approve HOST MODEL [MODEL...]`: add a box to placement.yaml as a git commit.

The placement is edited as YAML round-trip (comments and formatting kept), the box gets the first
free listen ports, the whole fleet is validated with the change, and the commit goes on a new
branch `approve/<host>` (ready to push for a pull request) or, with --onto BRANCH or a config whose
repo.approve.target is `tracked`, onto that branch. The working tree is never touched.
"""

from __future__ import annotations

import argparse
from typing import Any

from fleetllm.cli.common import CONFIG_SEARCH, EXIT_INVALID, EXIT_OK, CommandError, eprint, find_config
from fleetllm.core.fleet.model import Provider
from fleetllm.errors import ConfigurationError


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "approve",
        description="Add HOST to placement.yaml with one server per MODEL on free listen ports, validate, and "
                    "commit on a new branch approve/<host> (the working tree is not touched).")
    parser.add_argument("host", metavar="HOST", help="the box name (public IP or provider id)")
    parser.add_argument("models", metavar="MODEL", nargs="+", help="catalog names of the models to run")
    parser.add_argument("--provider", choices=[p.value for p in Provider],
                        help="where the box is rented: written as its `provider:` (the reconciler then finds its "
                             "public ports in that provider's listing); without it the box is static (public port "
                             "= listen port)")
    parser.add_argument("--repo", metavar="DIR",
                        help="the fleet repository (default: the config's repo.path, else the current directory)")
    parser.add_argument("--base", metavar="BRANCH", help="branch to start from (default: the checked-out HEAD)")
    parser.add_argument("--onto", metavar="BRANCH", help="commit onto BRANCH instead of a new approve/<host> branch")
    parser.add_argument("--config", metavar="FILE",
                        help="take the repository, branch and approve.target from a control-plane config (without "
                             f"--repo, default: {CONFIG_SEARCH}; a found config that tracks a remote url is not "
                             "used)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from fleetllm.adapters.approve import ApproveError, approve, open_repo
    from fleetllm.settings import ApproveTarget, load_config

    repo_path, base, onto = args.repo or ".", args.base, args.onto
    path = args.config or (None if args.repo else find_config(None))  # an explicit --repo is not overridden
    if path:
        try:
            config = load_config(path)
        except ConfigurationError as exc:
            raise CommandError(f"invalid config:\n{exc}") from None
        if config.repo.path is None and args.config:
            raise CommandError("the config tracks a remote url; run approve in a clone of it with --repo")
        if config.repo.path is None:
            eprint(f"fleetllm approve: {path} tracks a remote url, so its repository is not used here: approving "
                   "in the current directory (--repo DIR to choose)")
        else:
            repo_path, base = config.repo.path, config.repo.branch
            if config.repo.approve_target is ApproveTarget.TRACKED:
                onto = config.repo.branch
    if onto is not None and base is not None and onto != base:
        raise CommandError("--onto and --base name different branches; give one")
    try:
        done = approve(open_repo(repo_path), args.host, args.models, base_branch=onto or base,
                       onto_tracked=onto is not None, note=f"Approved with fleetllm approve ({' '.join(args.models)})",
                       provider=Provider(args.provider) if args.provider else None)
    except ApproveError as exc:
        raise CommandError(str(exc), EXIT_INVALID) from None
    for row in done.rows:
        print(f"{done.host}: {row.name} ({row.model}) on listen port {row.port}")
    print(f"branch {done.branch}")
    print(f"commit {done.commit}")
    if onto is None:
        print(f"push it for review: git push origin {done.branch}")
    return EXIT_OK
