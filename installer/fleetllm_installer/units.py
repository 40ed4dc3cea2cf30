"""Supervisor program files, one per server: pure rendering and the quoting Supervisor 4.3 needs.

Supervisor's parser has traps (docs/wire-formats.md, "Supervisor"), handled here:
- `%` starts an interpolation: written `%%`.
- ` #` or ` ;` (whitespace, then `#` or `;`) ends the line as a comment, even inside quotes.
- `command` is split by POSIX shlex (not run by a shell): every character outside a safe alphabet is
  backslash-escaped, and whitespace is single-quoted, so no whitespace is ever followed by `#`/`;`
  and no trailing whitespace is stripped away. `tests/installer/test_units.py` checks any argument
  round-trips through Supervisor's own parser.
- `environment` is split by a non-POSIX shlex that cannot escape anything: values are restricted to a
  strict alphabet and double-quoted; anything else is refused, never written half-right.

The bearer reaches vLLM as VLLM_API_KEY in the program's environment, never in argv (argv is
world-readable in /proc/*/cmdline, and old vLLMs log their args). Files holding it are mode 0600.
The box gateway's program holds no secret: it reads its bearers from $CREDENTIALS_DIRECTORY.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from fleetllm_contract.boxjson import GATEWAY_PROGRAM, unsafe_token
from fleetllm_contract.gatewaynative import ENV as NATIVE_ENV
from fleetllm_installer.boxjson import GatewaySpec, ServerSpec
from fleetllm_installer.errors import InstallerError
from fleetllm_installer.fit import Placement
from fleetllm_installer.settings import SECRET_VARS, Settings

PREFIX = "fleetllm-"  # program and file namespace; see MARKER
MARKER = "; fleetllm-installer: managed file, rewritten or removed on every install; do not edit"
ENV_VALUE = re.compile(r"^[A-Za-z0-9_./+:=,@-]*\Z")
_SAFE_TOKEN_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-./=:,@+")
STOPWAITSECS = 60
STARTRETRIES = 3
LOG_MAXBYTES = "50MB"
LOG_BACKUPS = 5
BASE_PRIORITY = 100
GATEWAY_PRIORITY = 50  # before the servers: it answers /health (and 502 for a loading model) at once
GATEWAY_STARTSECS = 3  # it binds in well under a second; exiting sooner is a failed start
GATEWAY_STOPWAITSECS = 10  # it gives in-flight requests 5 s after SIGTERM


class UnitError(InstallerError, ValueError):
    """A value cannot be written safely into a Supervisor file."""


@dataclass(frozen=True)
class Unit:
    server: str
    program: str
    path: Path
    text: str  # what is written (holds the bearer)
    shown: str  # the same with the bearer redacted, for --dry-run and logs
    port: int | None = None  # a server's listen port (None for the box gateway)


def program_name(server: str) -> str:
    return PREFIX + server


def quote_token(token: str) -> str:
    """One argv element, escaped for Supervisor's `command=` (configparser, then POSIX shlex)."""
    problem = unsafe_token(token)
    if problem:
        raise UnitError(f"argument {token!r} {problem}")
    if token == "":
        return "''"
    out = []
    for ch in token:
        if ch in _SAFE_TOKEN_CHARS:
            out.append(ch)
        elif ch == "%":
            out.append("%%")
        elif ch.isspace():
            out.append(f"'{ch}'")
        else:
            out.append("\\" + ch)
    return "".join(out)


def command_line(argv: list[str]) -> str:
    return " ".join(quote_token(token) for token in argv)


def environment_line(env: dict[str, str]) -> str:
    for key, value in env.items():
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*\Z", key):
            raise UnitError(f"environment variable name {key!r} is not valid")
        if not ENV_VALUE.match(value):
            shown = "(value not shown)" if key == "VLLM_API_KEY" else repr(value)
            raise UnitError(f"environment value of {key} {shown} has characters outside A-Z a-z 0-9 _./+:=,@-, "
                            "which Supervisor's environment parser cannot carry")
    return ",".join(f'{key}="{value}"' for key, value in env.items())


def redact(bearer: str) -> str:
    return "<redacted sha256:" + hashlib.sha256(bearer.encode()).hexdigest()[:12] + ">"


def listen_host(server: ServerSpec, settings: Settings) -> str:
    """Loopback when the box JSON puts the server behind the gateway, else the installer's setting."""
    return server.listen_host or settings.listen_host


def vllm_argv(server: ServerSpec, placement: Placement, settings: Settings) -> list[str]:
    host = listen_host(server, settings)
    argv = [settings.vllm_bin, "serve", server.model, "--host", host, "--port", str(server.port)]
    if server.served_model_name:
        argv += ["--served-model-name", server.served_model_name]
    if server.max_model_len is not None:
        argv += ["--max-model-len", str(server.max_model_len)]
    if placement.gpu_memory_utilization is not None:
        argv += ["--gpu-memory-utilization", f"{placement.gpu_memory_utilization:g}"]
    return argv + list(server.args)


def health_host(listen_host: str) -> str:
    if listen_host in ("0.0.0.0", ""):  # noqa: S104 - the address vLLM binds, not ours
        return "127.0.0.1"
    return "::1" if listen_host == "::" else listen_host


def launcher_argv(server: ServerSpec, placement: Placement, ports: dict[str, int], settings: Settings,
                  python: str) -> list[str]:
    """The launcher waits for the servers before this one on its card, then execs `vllm serve`."""
    argv = [python, str(settings.launcher_path), "--name", server.name,
            "--health-host", health_host(listen_host(server, settings)),
            "--wait-timeout", str(settings.start_timeout_s)]
    for earlier in placement.after:
        argv += ["--after", f"{earlier}={placement.after_ports.get(earlier, ports.get(earlier))}"]
    return [*argv, "--", *vllm_argv(server, placement, settings)]


def environment(server: ServerSpec, placement: Placement, settings: Settings, gpu_count: int) -> dict[str, str]:
    env = {
        "VLLM_API_KEY": server.api_key,
        "HF_HOME": str(settings.hf_home),
        "PYTHONUNBUFFERED": "1",
        "FLEETLLM_SERVER": server.name,
        # A changed digest (boot-lifetime fields) changes the program, so `supervisorctl update`
        # restarts exactly the servers whose boot config changed.
        "FLEETLLM_DIGEST": server.digest,
    }
    # supervisord passes its own environment on; where it inherited the fleet key (a Vast template
    # sets it for the whole container), blank it for vLLM, which has no use for it.
    env.update(dict.fromkeys(SECRET_VARS, ""))
    if gpu_count > 1 and placement.gpus:
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # CUDA numbers GPUs like nvidia-smi
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in placement.gpus)
    return env


def _output(log: Path) -> list[str]:
    return ["redirect_stderr=true", f"stdout_logfile={log}", f"stdout_logfile_maxbytes={LOG_MAXBYTES}",
            f"stdout_logfile_backups={LOG_BACKUPS}", ""]


def render_unit(server: ServerSpec, placement: Placement, *, ports: dict[str, int],
                settings: Settings, python: str, revision: str, gpu_count: int) -> Unit:
    program = program_name(server.name)
    env = environment(server, placement, settings, gpu_count)
    log = settings.log_dir / f"{server.name}.log"
    lines = [
        MARKER,
        f"; server {server.name} on port {server.port}, revision {revision}",
        f"[program:{program}]",
        "command=" + command_line(launcher_argv(server, placement, ports, settings, python)),
        f"directory={settings.data_dir}",
        "environment=" + environment_line(env),
        # One priority for every server: the launcher orders the starts on a card, and a priority from
        # the server's place in name order would change (and restart) every later server when one is added.
        f"priority={BASE_PRIORITY}",
        "autostart=true",
        "autorestart=true",
        f"startsecs={settings.startsecs}",
        f"startretries={STARTRETRIES}",
        "stopsignal=TERM",
        f"stopwaitsecs={STOPWAITSECS}",
        "stopasgroup=true",
        "killasgroup=true",
        *_output(log),
    ]
    text = "\n".join(lines)
    shown = text.replace(f'VLLM_API_KEY="{server.api_key}"', f'VLLM_API_KEY="{redact(server.api_key)}"')
    return Unit(server=server.name, program=program, path=settings.conf_dir / f"{program}.conf",
                text=text, shown=shown, port=server.port)


def render_gateway_unit(gateway: GatewaySpec, *, settings: Settings, python: str, revision: str,
                        config_sha256: str, program_sha256: str, native: Path | None = None) -> Unit:
    """The box gateway's program: `PYTHON fleetllm-gateway.pyz gateway --config FILE`. A new config, box
    program, bearer (the JSON's digest covers their fingerprints) or build of its compiled modules
    (`native`, named by its sha256) changes the program, so `supervisorctl update` restarts the gateway
    exactly then."""
    program = program_name(GATEWAY_PROGRAM)
    env = {
        "CREDENTIALS_DIRECTORY": str(settings.credentials_dir),
        "PYTHONUNBUFFERED": "1",
        "FLEETLLM_DIGEST": gateway.digest,
        "FLEETLLM_CONFIG_SHA256": config_sha256,
        "FLEETLLM_PROGRAM_SHA256": program_sha256,
        NATIVE_ENV: str(native) if native is not None else "",  # empty: none, whatever supervisord inherited
        **dict.fromkeys(SECRET_VARS, ""),
    }
    argv = [python, str(settings.gateway_program_path), "gateway", "--box-json", "--config",
            str(settings.gateway_config_path)]
    lines = [
        MARKER,
        f"; box gateway on port {gateway.port}, revision {revision}",
        f"[program:{program}]",
        "command=" + command_line(argv),
        f"directory={settings.gateway_dir}",
        "environment=" + environment_line(env),
        f"priority={GATEWAY_PRIORITY}",
        "autostart=true",
        "autorestart=true",
        f"startsecs={GATEWAY_STARTSECS}",
        f"startretries={STARTRETRIES}",
        "stopsignal=TERM",
        f"stopwaitsecs={GATEWAY_STOPWAITSECS}",
        "stopasgroup=true",
        "killasgroup=true",
        *_output(settings.log_dir / f"{GATEWAY_PROGRAM}.log"),
    ]
    text = "\n".join(lines)
    return Unit(server=GATEWAY_PROGRAM, program=program, path=settings.conf_dir / f"{program}.conf",
                text=text, shown=text)
