"""Run by the harness's Python (vLLM installed there, not in the project's venv): asks vLLM's own `serve`
argument parser, built as the `vllm` command builds it, what a command line means. Standard library and
vLLM only; JSON in on stdin, JSON out on stdout.

    python vllm_parser_probe.py options          -> {dest: [option strings]} of every `serve` option
    python vllm_parser_probe.py parse < CASES    -> for each case (a list of tokens after `serve MODEL`):
                                                    {"error": msg} or {"set": {dest: value}} (dests it changed)
    python vllm_parser_probe.py argv < LINES     -> for each whole command line after the program name:
                                                    {"error": msg} or {"set": {dest: value}} (every dest)
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
from typing import Any

MODEL = "org/probe-model"


def serve_parser() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm")
    subparsers = parser.add_subparsers(required=False, dest="subparser")
    serve = ServeSubcommand().subparser_init(subparsers)
    return parser, serve


def plain(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except TypeError:
        return repr(value)


def main() -> int:
    parser, serve = serve_parser()
    if sys.argv[1] == "options":
        options: dict[str, list[str]] = {}
        for action in serve._actions:
            if action.option_strings:
                options.setdefault(action.dest, []).extend(action.option_strings)
        json.dump(options, sys.stdout)
        return 0
    cases = json.load(sys.stdin)
    if sys.argv[1] == "argv":  # whole command lines (after the program name): what each one sets
        parsed_lines = []
        for argv in cases:
            sink = io.StringIO()
            try:
                with contextlib.redirect_stderr(sink), contextlib.redirect_stdout(sink):
                    namespace = parser.parse_args(argv)
                parsed_lines.append({"set": {k: plain(v) for k, v in vars(namespace).items()}})
            except SystemExit:
                parsed_lines.append({"error": sink.getvalue().strip().splitlines()[-1:] or ["rejected"]})
            except Exception as exc:
                parsed_lines.append({"error": [f"{type(exc).__name__}: {exc}"]})
        json.dump(parsed_lines, sys.stdout)
        return 0
    base = vars(parser.parse_args(["serve", MODEL]))
    results = []
    for tokens in cases:
        sink = io.StringIO()
        try:
            with contextlib.redirect_stderr(sink), contextlib.redirect_stdout(sink):
                parsed = vars(parser.parse_args(["serve", MODEL, *tokens]))
        except SystemExit:
            results.append({"error": sink.getvalue().strip().splitlines()[-1:] or ["rejected"]})
            continue
        except Exception as exc:
            results.append({"error": [f"{type(exc).__name__}: {exc}"]})
            continue
        changed = {k: plain(v) for k, v in parsed.items() if base.get(k) != v}
        results.append({"set": changed})
    json.dump(results, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
