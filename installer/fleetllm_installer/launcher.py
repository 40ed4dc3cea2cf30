#!/usr/bin/env python3
"""fleetllm-launch: boot one vLLM server after the servers before it on its card, then become it.

    fleetllm-launch --name NAME [--after NAME=PORT ...] [--health-host H] [--wait-timeout S] -- vllm serve ...

Supervisor runs this as the program's command. It waits until every `--after` server answers
GET /health with 200 (or --wait-timeout seconds pass), then execs the command, so the Supervisor
process *is* vLLM from then on: signals, stopasgroup/killasgroup and exit codes work as if
Supervisor had started vLLM itself. Because the wait lives in the program, ordering survives
Supervisor's own restarts and a box reboot: a restarted server waits only while an earlier one on
its card is not yet healthy (two vLLMs profiling GPU memory at once can run out of memory).

A server that keeps running while its neighbours change keeps its program as it is (a changed program
is a restart), so its `--after` may name a server that has left the box since. The installer lists the
servers it installed last, NAME=PORT a line, in the file PRESENT beside this script; an `--after` that
is not listed there is not waited for. Without that file every `--after` is waited for.

The installer copies this file to $DATA/fleetllm/bin/fleetllm-launch. Standard library only, and it
imports nothing from the installer package. The bearer reaches vLLM through the environment
(VLLM_API_KEY), which this script passes on untouched and never reads or prints.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import sys
import time
from pathlib import Path

POLL_S = 2.0


def log(message: str, level: str = "info") -> None:
    """One line of the fleetllm log format (fleetllm_contract.logfmt, written out here: this file stands
    alone on the box), into the program's log before vLLM's own lines."""
    now = time.time()
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d}Z"
    print(json.dumps({"ts": stamp, "level": level, "logger": "fleetllm.launch", "event": message},
                     separators=(",", ":")), flush=True)


def healthy(host: str, port: int, timeout_s: float = 3.0) -> bool:
    """GET /health answered 200. Refused, reset, timeout or any other status: not (yet) healthy."""
    connection = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        connection.request("GET", "/health")
        return connection.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        connection.close()


def wait_for(earlier: list[tuple[str, int]], host: str, timeout_s: float, poll_s: float = POLL_S) -> bool:
    """Wait until every earlier server is healthy; False when the timeout passed first."""
    deadline = time.monotonic() + timeout_s
    pending = list(earlier)
    while pending:
        pending = [(name, port) for name, port in pending if not healthy(host, port)]
        if not pending:
            break
        if time.monotonic() >= deadline:
            names = ", ".join(f"{name} (port {port})" for name, port in pending)
            log(f"gave up waiting after {timeout_s:g} s for {names}; starting anyway", "warning")
            return False
        time.sleep(poll_s)
    return True


PRESENT = "servers"  # beside this script: the servers the last install wrote, NAME=PORT a line


def present_servers(path: Path) -> set[tuple[str, int]] | None:
    """The servers the last install wrote, or None when the file is missing or unreadable."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    found = set()
    for line in lines:
        name, sep, port = line.strip().rpartition("=")
        if sep and name and port.isdigit():
            found.add((name, int(port)))
    return found


def _after(value: str) -> tuple[str, int]:
    name, sep, port = value.rpartition("=")
    if not sep or not name or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected NAME=PORT, got {value!r}")
    return name, int(port)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fleetllm-launch", description=__doc__.split("\n")[1])
    parser.add_argument("--name", required=True)
    parser.add_argument("--after", type=_after, action="append", default=[], metavar="NAME=PORT")
    parser.add_argument("--health-host", default="127.0.0.1")
    parser.add_argument("--wait-timeout", type=float, default=1800.0)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command after --")
    present = present_servers(Path(__file__).resolve().parent / PRESENT)
    if present is not None:
        gone = [f"{name} (port {port})" for name, port in args.after if (name, port) not in present]
        if gone:
            log(f"{args.name}: not waiting for {', '.join(gone)}: no longer on this box")
        args.after = [entry for entry in args.after if entry in present]
    if args.after:
        names = ", ".join(name for name, _ in args.after)
        log(f"{args.name}: waiting for {names} to answer /health")
        if wait_for(args.after, args.health_host, args.wait_timeout):
            log(f"{args.name}: {names} healthy")
    log(f"{args.name}: starting {command[0]} {' '.join(command[1:3])}")
    try:
        os.execvp(command[0], command)  # noqa: S606 - becoming vLLM is the point
    except OSError as exc:
        log(f"{args.name}: cannot run {command[0]}: {exc.strerror}", "error")
    return 127  # execvp returns only by raising


if __name__ == "__main__":
    sys.exit(main())
