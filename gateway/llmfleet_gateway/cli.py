"""`llmfleet-gateway --config FILE [--check]` (also `llmfleet gateway`, `python3 box.pyz gateway`).

Exit 0 after a clean stop or a valid `--check`, 1 on an invalid configuration or a failed bind.
LLMhop's single-dash spellings (`-config`, `-check`) are accepted too.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from llmfleet_gateway import __version__
from llmfleet_gateway.config import ConfigError, load_config


def build_parser(prog: str = "llmfleet-gateway") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, description="One port, many models: an LLMhop-compatible router for OpenAI-style backends.")
    add_arguments(parser)
    return parser


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--version", "-version", action="version", version=f"llmfleet-gateway {__version__}")
    parser.add_argument("--config", "-config", default="config.json", metavar="FILE",
                        help="the JSON configuration (default: config.json in the working directory)")
    parser.add_argument("--check", "-check", action="store_true",
                        help="validate the configuration and build the router without binding; secret references "
                             "are checked for syntax but not read. Exit 0 valid, 1 invalid")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run(Path(args.config), check=args.check)


def run(config_path: Path, *, check: bool) -> int:
    logging.basicConfig(level=logging.INFO, format="llmfleet-gateway: %(message)s", stream=sys.stderr)
    try:
        config = load_config(config_path, expand_secrets=not check)
    except ConfigError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        return 1
    # Imported here so `--check` on a config error needs no aiohttp import time.
    from llmfleet_gateway.app import Gateway
    from llmfleet_gateway.proxyenv import ProxyError
    from llmfleet_gateway.serve import BindError, serve, serve_forever

    if check:
        Gateway(config).close()
        print(f"{config_path}: valid ({len(config.models)} models, {len(config.listed)} listed)")
        return 0
    try:
        return serve_forever(serve(config))
    except (BindError, ProxyError) as exc:
        print(f"llmfleet-gateway: {exc}", file=sys.stderr)
        return 1
