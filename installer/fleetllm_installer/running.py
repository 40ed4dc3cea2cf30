"""What the last install wrote for each server, read back from its Supervisor program.

The card division keeps a running server's fraction, GPUs and start order when it can
(fit.py, fleetllm_contract.division), so it needs what that server runs with now. That is read from the
program files this installer wrote (MARKER on the first line), not from a state file of its own: the
program is exactly what supervisord compares on `update`, so it cannot disagree with what runs, it
survives a wiped or read-only data directory, and a crash between writing a state file and the programs
cannot leave the two out of step. A program that cannot be read or parsed is simply not kept (the
division is then today's fresh one): never an error.

A server counts as running unchanged when its program names it, carries the same non-empty digest (the
box JSON's hash of its boot fields) and the same bearer.
"""

from __future__ import annotations

import configparser
import hmac
import re
import shlex
from collections.abc import Iterable
from pathlib import Path

from fleetllm_installer.boxjson import ServerSpec
from fleetllm_installer.fit import Running
from fleetllm_installer.units import MARKER, program_name

ENV_PAIR = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="([^"]*)"')
MAX_PROGRAM_BYTES = 1 << 20


def _program(path: Path) -> dict[str, str] | None:
    """The [program:...] section of one of our files, or None."""
    try:
        if path.stat().st_size > MAX_PROGRAM_BYTES:
            return None
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    if text.split("\n", 1)[0] != MARKER:
        return None
    parser = configparser.RawConfigParser(interpolation=None, strict=False)
    try:
        parser.read_string(text)
    except configparser.Error:
        return None
    sections = [s for s in parser.sections() if s.startswith("program:")]
    return dict(parser[sections[0]]) if len(sections) == 1 else None


def parse_program(options: dict[str, str]) -> tuple[dict[str, str], Running] | None:
    """The environment and what `Running` needs from a program's options, or None when it is not ours."""
    env = dict(ENV_PAIR.findall(options.get("environment", "")))
    try:
        argv = shlex.split(options.get("command", "").replace("%%", "%"))
    except ValueError:
        return None
    if "--" not in argv:
        return None
    split = argv.index("--")
    launcher, vllm = argv[:split], argv[split + 1:]
    pairs = [launcher[i + 1].rpartition("=") for i, arg in enumerate(launcher[:-1]) if arg == "--after"]
    if any(not name or not port.isdigit() for name, _, port in pairs):
        return None
    after = tuple(name for name, _, _ in pairs)
    after_ports = {name: int(port) for name, _, port in pairs}
    share: float | None = None
    for i, arg in enumerate(vllm[:-1]):
        if arg == "--gpu-memory-utilization":
            try:
                share = float(vllm[i + 1])
            except ValueError:
                return None
            if not 0 < share <= 1:
                return None
    devices = env.get("CUDA_VISIBLE_DEVICES", "")
    try:
        gpus = tuple(int(d) for d in devices.split(",")) if devices else ()
    except ValueError:
        return None
    return env, Running(share=share, gpus=gpus, after=after, after_ports=after_ports)


def read_running(conf_dir: Path, servers: Iterable[ServerSpec]) -> dict[str, Running]:
    """Each server of the new box JSON that runs unchanged under a program we wrote: what it runs with."""
    found: dict[str, Running] = {}
    for server in servers:
        if not server.digest:
            continue  # nothing tells an unchanged server from a changed one: divide afresh, as before
        options = _program(conf_dir / f"{program_name(server.name)}.conf")
        parsed = parse_program(options) if options is not None else None
        if parsed is None:
            continue
        env, running = parsed
        if (env.get("FLEETLLM_SERVER") == server.name and env.get("FLEETLLM_DIGEST") == server.digest
                and hmac.compare_digest(env.get("VLLM_API_KEY", "").encode(), server.api_key.encode())):
            found[server.name] = running
    return found
