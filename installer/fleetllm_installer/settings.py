"""The installer's settings, all from the environment (the box template and the provisioning script).

The installer knows no provider's names: the provisioning script maps the provider's variables onto
LLMAO_HOST. Legacy names from llmao's install_set.py (FLEET_KEY, ASFQUART_URL, SUPERVISOR_CONF_DIR,
VLLM_BIN, DATA_DIRECTORY) are accepted, so an existing box template keeps working.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from fleetllm_installer.errors import InstallerError

# (preferred name, legacy names...): the first one set wins.
HOST_VARS = ("LLMAO_HOST",)
URL_VARS = ("FLEETLLM_URL", "ASFQUART_URL")
KEY_VARS = ("FLEETLLM_FLEET_KEY", "FLEET_KEY")
CA_VARS = ("FLEETLLM_CA_BUNDLE",)
DATA_VARS = ("FLEETLLM_DATA_DIR", "DATA_DIRECTORY")
CONF_DIR_VARS = ("FLEETLLM_SUPERVISOR_CONF_DIR", "SUPERVISOR_CONF_DIR")
SUPERVISOR_CONFIG_VARS = ("FLEETLLM_SUPERVISOR_CONFIG",)
VLLM_BIN_VARS = ("FLEETLLM_VLLM_BIN", "VLLM_BIN")
HF_HOME_VARS = ("FLEETLLM_HF_HOME",)
LISTEN_HOST_VARS = ("FLEETLLM_LISTEN_HOST",)
START_TIMEOUT_VARS = ("FLEETLLM_START_TIMEOUT_S",)
STARTSECS_VARS = ("FLEETLLM_STARTSECS",)
FETCH_DEADLINE_VARS = ("FLEETLLM_FETCH_DEADLINE_S",)
GATEWAY_PYTHON_VARS = ("FLEETLLM_GATEWAY_PYTHON",)
GATEWAY_COMPILED_VARS = ("FLEETLLM_GATEWAY_COMPILED",)

# Every variable that holds the fleet key: stripped from the environment supervisord inherits.
SECRET_VARS = KEY_VARS
# The box agent's program gets the fleet key as a file (mode 0600) in $CREDENTIALS_DIRECTORY (systemd's
# convention, as the box gateway's bearers), never in a Supervisor file or on a command line.
CREDENTIALS_VAR = "CREDENTIALS_DIRECTORY"
FLEET_KEY_CREDENTIAL = "fleet-key"

DEFAULT_DATA_DIR = "/workspace"
DEFAULT_CONF_DIR = "/etc/supervisor/conf.d"
DEFAULT_VLLM_BIN = "vllm"
DEFAULT_LISTEN_HOST = "0.0.0.0"  # noqa: S104 - vLLM (or the box gateway) must be reachable through the port map
DEFAULT_START_TIMEOUT_S = 1800
DEFAULT_STARTSECS = 60
DEFAULT_FETCH_DEADLINE_S = 600.0

# What a path may contain so that it is safe in every Supervisor value (command, environment, logfile)
# without quoting: no whitespace, `#`, `;`, `%`, quotes or `,`.
SAFE_PATH = re.compile(r"^[A-Za-z0-9_./+:@-]+\Z")


class SettingsError(InstallerError, ValueError):
    """A missing or bad environment variable; the message names it and says what to set."""


@dataclass(frozen=True)
class Settings:
    host: str | None  # LLMAO_HOST; may be absent only with --config-file
    url: str | None
    fleet_key: str | None
    ca_bundle: Path | None
    data_dir: Path
    conf_dir: Path
    supervisor_config: Path | None
    vllm_bin: str
    hf_home: Path
    listen_host: str
    start_timeout_s: int
    startsecs: int
    fetch_deadline_s: float
    gateway_python: str | None = None  # a Python with httptools for the box gateway; None: look for one
    gateway_compiled: bool = True  # fetch the gateway's compiled modules for that Python (boxgateway.py)

    def __repr__(self) -> str:  # the fleet key never reaches a log through repr()
        return f"Settings(host={self.host!r}, url={self.url!r}, data_dir={str(self.data_dir)!r})"

    @property
    def state_dir(self) -> Path:
        return self.data_dir / "fleetllm"

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "logs"

    @property
    def launcher_path(self) -> Path:
        return self.state_dir / "bin" / "fleetllm-launch"

    @property
    def gateway_program_path(self) -> Path:
        """The box program the gateway runs from (a copy of the installer's own zipapp)."""
        return self.state_dir / "bin" / "fleetllm-gateway.pyz"

    @property
    def agent_dir(self) -> Path:
        return self.state_dir / "agent"

    @property
    def agent_program_path(self) -> Path:
        """The box program the agent runs from (a copy of the installer's own zipapp)."""
        return self.state_dir / "bin" / "fleetllm-agent.pyz"

    @property
    def agent_credentials_dir(self) -> Path:
        return self.agent_dir / "credentials"

    @property
    def agent_state_path(self) -> Path:
        """What the box last applied (the sha256 of the box JSON) and the poll interval, for the agent."""
        return self.agent_dir / "state.json"

    @property
    def install_lock_path(self) -> Path:
        """Held while programs are written and handed to supervisord: an installer and the agent never
        apply at once (a Vast box's restart starts both)."""
        return self.state_dir / "install.lock"

    @property
    def gateway_dir(self) -> Path:
        return self.state_dir / "gateway"

    @property
    def gateway_config_path(self) -> Path:
        return self.gateway_dir / "gateway.json"

    @property
    def gateway_native_dir(self) -> Path:
        """The compiled gateway's builds, one directory each, named by the sha256 of its archive."""
        return self.gateway_dir / "native"

    @property
    def credentials_dir(self) -> Path:
        """$CREDENTIALS_DIRECTORY of the gateway's program: its client token and the servers' bearers."""
        return self.gateway_dir / "credentials"


def _first(env: Mapping[str, str], names: tuple[str, ...]) -> tuple[str, str] | None:
    for name in names:
        value = env.get(name, "").strip()
        if value:
            return name, value
    return None


def _names(names: tuple[str, ...]) -> str:
    if len(names) == 1:
        return names[0]
    return f"{names[0]} (or the legacy {', '.join(names[1:])})"


def _require(env: Mapping[str, str], names: tuple[str, ...], what: str) -> str:
    found = _first(env, names)
    if found is None:
        raise SettingsError(f"{_names(names)} is not set: it must hold {what}")
    return found[1]


def _number(env: Mapping[str, str], names: tuple[str, ...], default: float, minimum: float) -> float:
    found = _first(env, names)
    if found is None:
        return default
    name, raw = found
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not a number") from None
    if not value < 1e9:  # also NaN and infinity, which no deadline or interval means
        raise SettingsError(f"{name}={raw!r} must be a number of seconds below 1e9")
    if value < minimum:
        raise SettingsError(f"{name}={raw!r} must be at least {minimum:g}")
    return value


def _switch(env: Mapping[str, str], names: tuple[str, ...], default: bool) -> bool:
    found = _first(env, names)
    if found is None:
        return default
    value = found[1].lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise SettingsError(f"{found[0]}={found[1]!r} is neither 1 nor 0 (true/false, yes/no, on/off)")


def _safe_path(name: str, value: str) -> Path:
    if not value.startswith("/") or not SAFE_PATH.match(value):
        raise SettingsError(f"{name}={value!r} must be an absolute path of letters, digits and _./+:@- "
                            "(it is written into Supervisor files, which cannot quote other characters)")
    return Path(value)


def _path(env: Mapping[str, str], names: tuple[str, ...], default: str) -> Path:
    found = _first(env, names)
    name, value = found if found is not None else (names[0], default)
    return _safe_path(name, value)


def _credential_key(env: Mapping[str, str]) -> str | None:
    """The fleet key from $CREDENTIALS_DIRECTORY/fleet-key (the box agent's program), or None."""
    directory = env.get(CREDENTIALS_VAR, "").strip()
    if not directory:
        return None
    try:
        key = (Path(directory) / FLEET_KEY_CREDENTIAL).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return key or None


def load(env: Mapping[str, str] | None = None, *, need_control_plane: bool = True) -> Settings:
    """Read the settings. `need_control_plane=False` (--config-file) makes host, URL and key optional."""
    environ = os.environ if env is None else env
    if need_control_plane:
        host: str | None = _require(environ, HOST_VARS, "this box's name in the placement "
                                    "(the provisioning script sets it: the public IP on Vast, the pod id on RunPod)")
        url: str | None = _require(environ, URL_VARS, "the control plane's base URL, e.g. https://fleet.example.org")
        key: str | None = _credential_key(environ) if _first(environ, KEY_VARS) is None else None
        key = key or _require(environ, KEY_VARS, "the fleet key")
    else:
        host = (_first(environ, HOST_VARS) or (None, None))[1]
        url = (_first(environ, URL_VARS) or (None, None))[1]
        key = (_first(environ, KEY_VARS) or (None, None))[1] or _credential_key(environ)
    ca = _first(environ, CA_VARS)
    if ca is not None and not Path(ca[1]).is_file():
        raise SettingsError(f"{ca[0]}={ca[1]!r} is not a readable file (a PEM bundle of CA certificates)")
    data_dir = _path(environ, DATA_VARS, DEFAULT_DATA_DIR)
    hf = _first(environ, HF_HOME_VARS)
    supervisor_config = _first(environ, SUPERVISOR_CONFIG_VARS)
    vllm_bin = (_first(environ, VLLM_BIN_VARS) or (VLLM_BIN_VARS[0], DEFAULT_VLLM_BIN))
    if not SAFE_PATH.match(vllm_bin[1]):
        raise SettingsError(f"{vllm_bin[0]}={vllm_bin[1]!r} must be a command name or path of letters, "
                            "digits and _./+:@-")
    gateway_python = _first(environ, GATEWAY_PYTHON_VARS)
    if gateway_python is not None and not SAFE_PATH.match(gateway_python[1]):
        raise SettingsError(f"{gateway_python[0]}={gateway_python[1]!r} must be a command name or path of "
                            "letters, digits and _./+:@-")
    listen = (_first(environ, LISTEN_HOST_VARS) or (LISTEN_HOST_VARS[0], DEFAULT_LISTEN_HOST))
    if not re.match(r"^[A-Za-z0-9.:-]+\Z", listen[1]):
        raise SettingsError(f"{listen[0]}={listen[1]!r} is not an address")
    return Settings(
        host=host,
        url=url.rstrip("/") if url else None,
        fleet_key=key,
        ca_bundle=Path(ca[1]) if ca is not None else None,
        data_dir=data_dir,
        conf_dir=_path(environ, CONF_DIR_VARS, DEFAULT_CONF_DIR),
        supervisor_config=_safe_path(*supervisor_config) if supervisor_config is not None else None,
        vllm_bin=vllm_bin[1],
        hf_home=_safe_path(*hf) if hf is not None else data_dir / "hf-cache",
        listen_host=listen[1],
        start_timeout_s=int(_number(environ, START_TIMEOUT_VARS, DEFAULT_START_TIMEOUT_S, 0)),
        startsecs=int(_number(environ, STARTSECS_VARS, DEFAULT_STARTSECS, 1)),
        fetch_deadline_s=_number(environ, FETCH_DEADLINE_VARS, DEFAULT_FETCH_DEADLINE_S, 0),
        gateway_python=gateway_python[1] if gateway_python is not None else None,
        gateway_compiled=_switch(environ, GATEWAY_COMPILED_VARS, True),
    )
