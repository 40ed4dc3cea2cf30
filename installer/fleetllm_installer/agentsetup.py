"""The box agent's Supervisor program, its files, and their removal (the agent itself is agent.py).

When the box JSON has `"agent": {"poll_s": N}` the installer writes:
- $DATA/fleetllm/bin/fleetllm-agent.pyz: a copy of the box program it runs from (mode 0700);
- $DATA/fleetllm/agent/credentials/fleet-key: the fleet key (mode 0600, directory 0700), read by the
  agent through $CREDENTIALS_DIRECTORY, never on a command line or in the Supervisor file;
- the program `fleetllm-agent`: `PYTHON -S fleetllm-agent.pyz agent`, its environment the installer's
  own settings (the same variables settings.load() reads), so the agent applies a config exactly as
  this installer run did.

The program names neither the revision nor the poll interval (the agent reads that from each box
JSON): applying a new config never changes the agent's own program, so `supervisorctl update` leaves
the agent running. Only a new box program (its sha256 is in the environment) or new settings do.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from fleetllm_contract.boxjson import AGENT_PROGRAM
from fleetllm_installer.boxgateway import box_program, running_archive
from fleetllm_installer.handover import write_atomic
from fleetllm_installer.settings import CREDENTIALS_VAR, FLEET_KEY_CREDENTIAL, SECRET_VARS, Settings
from fleetllm_installer.units import (
    ENV_VALUE,
    MARKER,
    STARTRETRIES,
    Unit,
    UnitError,
    command_line,
    environment_line,
    program_name,
)

AGENT_STARTSECS = 3
AGENT_STOPWAITSECS = 30  # it stops at once, or when the apply in progress has reported
AGENT_PRIORITY = 900  # after the servers and the gateway


def agent_environment(settings: Settings, program_sha256: str) -> dict[str, str]:
    """The settings this installer run used, as the variables settings.load() reads."""
    assert settings.host is not None
    assert settings.url is not None
    env = {
        "LLMAO_HOST": settings.host,
        "FLEETLLM_URL": settings.url,
        "FLEETLLM_DATA_DIR": str(settings.data_dir),
        "FLEETLLM_SUPERVISOR_CONF_DIR": str(settings.conf_dir),
        "FLEETLLM_VLLM_BIN": settings.vllm_bin,
        "FLEETLLM_HF_HOME": str(settings.hf_home),
        "FLEETLLM_LISTEN_HOST": settings.listen_host,
        "FLEETLLM_START_TIMEOUT_S": str(settings.start_timeout_s),
        "FLEETLLM_STARTSECS": str(settings.startsecs),
        "FLEETLLM_FETCH_DEADLINE_S": f"{settings.fetch_deadline_s:g}",
    }
    if settings.ca_bundle is not None:
        env["FLEETLLM_CA_BUNDLE"] = str(settings.ca_bundle)
    if settings.supervisor_config is not None:
        env["FLEETLLM_SUPERVISOR_CONFIG"] = str(settings.supervisor_config)
    if settings.gateway_python is not None:
        env["FLEETLLM_GATEWAY_PYTHON"] = settings.gateway_python
    path = os.environ.get("PATH", "")
    if path and ENV_VALUE.match(path):  # supervisorctl and nvidia-smi are found as the installer found them
        env["PATH"] = path
    env.update({CREDENTIALS_VAR: str(settings.agent_credentials_dir), "PYTHONUNBUFFERED": "1",
                "FLEETLLM_PROGRAM_SHA256": program_sha256})
    env.update(dict.fromkeys(SECRET_VARS, ""))  # an inherited fleet key is blanked; the file is read instead
    return env


def render_agent_unit(settings: Settings, python: str, program_sha256: str) -> Unit:
    program = program_name(AGENT_PROGRAM)
    argv = [python, "-S", str(settings.agent_program_path), "agent"]
    lines = [
        MARKER,
        "; box agent: polls GET /vllm/config and applies a changed config as the installer does",
        f"[program:{program}]",
        "command=" + command_line(argv),
        f"directory={settings.agent_dir}",
        "environment=" + environment_line(agent_environment(settings, program_sha256)),
        f"priority={AGENT_PRIORITY}",
        "autostart=true",
        "autorestart=true",
        f"startsecs={AGENT_STARTSECS}",
        f"startretries={STARTRETRIES}",
        "stopsignal=TERM",
        f"stopwaitsecs={AGENT_STOPWAITSECS}",
        # Only the agent is signalled: a `supervisorctl update` it started finishes even if the agent stops.
        "stopasgroup=false",
        "killasgroup=false",
        "redirect_stderr=true",
        f"stdout_logfile={settings.log_dir / (AGENT_PROGRAM + '.log')}",
        "stdout_logfile_maxbytes=10MB",
        "stdout_logfile_backups=3",
        "",
    ]
    text = "\n".join(lines)
    return Unit(server=AGENT_PROGRAM, program=program, path=settings.conf_dir / f"{program}.conf", text=text,
                shown=text)


def plan_agent(settings: Settings, python: str) -> tuple[Unit, bytes]:
    """The agent's program and its box program's bytes. Raises UnitError when a setting cannot be
    carried in a Supervisor environment."""
    if not (settings.host and settings.url and settings.fleet_key):
        raise UnitError("the box agent needs the control plane settings (LLMAO_HOST, FLEETLLM_URL, the fleet key)")
    program = box_program()
    digest = "sha256:" + hashlib.sha256(program).hexdigest()
    return render_agent_unit(settings, python, digest), program


def write_agent(settings: Settings, program: bytes) -> None:
    """The box program and the fleet key credential. Raises OSError."""
    assert settings.fleet_key is not None
    if not (settings.agent_program_path.is_file() and settings.agent_program_path.read_bytes() == program):
        write_atomic(settings.agent_program_path, program, mode=0o700)
    directory = settings.agent_credentials_dir
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    write_atomic(directory / FLEET_KEY_CREDENTIAL, settings.fleet_key + "\n")


def remove_agent(settings: Settings) -> list[Path]:
    """A box without an agent: remove its credential, state and program. Returns what was removed.
    The program stays while the agent runs from it (its removal of itself): Python reads modules from
    the archive as it imports them; the next install overwrites it."""
    removed = []
    running = running_archive()
    for path in (settings.agent_credentials_dir / FLEET_KEY_CREDENTIAL, settings.agent_state_path,
                 settings.agent_program_path):
        if running is not None and path.resolve() == running.resolve():
            continue
        if path.is_file():
            path.unlink()
            removed.append(path)
    return removed
