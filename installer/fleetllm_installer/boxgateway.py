"""The box gateway on the box: the Python that runs it, its program, config and credentials.

When the box JSON has a `gateway`, the installer
1. finds a Python that imports httptools, the gateway's HTTP parser (FLEETLLM_GATEWAY_PYTHON, else the
   interpreter of the `vllm` script, a `python3` beside it, then its own; a vLLM image ships httptools,
   which uvicorn, vLLM's server, runs on);
2. checks the config with `PYTHON fleetllm-gateway.pyz gateway --check` in a temporary directory,
   before anything on the box changes;
3. writes `$DATA/fleetllm/bin/fleetllm-gateway.pyz` (a copy of the box program it runs from),
   `$DATA/fleetllm/gateway/gateway.json` (the rendered config, `host` set to FLEETLLM_LISTEN_HOST) and
   the credentials the config references as `${cred:NAME}`: `credentials/client-token` and
   `credentials/bearer-<server>` (directory 0700, files 0600, each written atomically).
Before the check, it fetches the gateway's compiled modules for that Python from the control plane
(gatewaynative.py); the check runs with them, and they are named in the gateway's program only when the
gateway says it runs them (`; compiled modules` in its verdict). Otherwise, and with
FLEETLLM_GATEWAY_COMPILED=0, the gateway runs its Python modules; the installer logs why.
Without a gateway these files are removed, so no bearer lingers on the box.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import zipfile
from dataclasses import dataclass, field, replace
from pathlib import Path

from fleetllm_contract.boxjson import CLIENT_TOKEN_CREDENTIAL, bearer_credential
from fleetllm_contract.gatewaynative import ENV as NATIVE_ENV
from fleetllm_contract.gatewaynative import tag_of
from fleetllm_installer import gatewaynative
from fleetllm_installer.boxjson import BoxConfig, GatewaySpec
from fleetllm_installer.errors import InstallerError
from fleetllm_installer.fetch import Client
from fleetllm_installer.handover import supervisord_environment, write_atomic
from fleetllm_installer.settings import SAFE_PATH, Settings
from fleetllm_installer.units import Unit, UnitError, render_gateway_unit

PROBE_TIMEOUT_S = 60.0
CHECK_TIMEOUT_S = 120.0
COMPILED_VERDICT = "; compiled modules)"  # the end of the gateway's --check verdict when it would run them
# What the probe prints: the Python's extension-module suffix, once httptools imports.
PROBE = "import httptools, importlib.machinery as m; print(m.EXTENSION_SUFFIXES[0])"


class BoxGatewayError(InstallerError, RuntimeError):
    """The gateway cannot be set up; the message says what to do."""


@dataclass(frozen=True)
class GatewayPlan:
    spec: GatewaySpec
    python: str
    program: bytes = field(repr=False)
    config_text: str = field(repr=False)
    credentials: dict[str, str] = field(repr=False)  # file name -> bearer
    unit: Unit = field(repr=False)
    native: Path | None = None  # the compiled modules named in the program (None: its Python modules)
    native_note: str = ""  # how the box got them, or why it runs the Python modules
    revision: str = ""
    held: Path | None = None  # the build the box held before a new one came (gatewaynative.Fetched.held)


def _shebang_interpreter(script: Path) -> str | None:
    """`#!/opt/venv/bin/python3` -> that path; None for `#!/usr/bin/env python3` or no shebang."""
    try:
        with script.open("rb") as handle:
            first = handle.readline(512).decode("utf-8", "replace")
    except OSError:
        return None
    if not first.startswith("#!"):
        return None
    words = first[2:].split()
    if not words or not words[0].startswith("/") or Path(words[0]).name == "env":
        return None
    return words[0]


def python_candidates(settings: Settings, own: str) -> list[str]:
    if settings.gateway_python:
        return [settings.gateway_python]
    found: list[str] = []
    vllm = shutil.which(settings.vllm_bin)
    if vllm:
        interpreter = _shebang_interpreter(Path(vllm))
        if interpreter:
            found.append(interpreter)
        found.append(str(Path(vllm).parent / "python3"))
    found.append(own)
    unique = []
    for candidate in found:
        if candidate not in unique and SAFE_PATH.match(candidate) and shutil.which(candidate):
            unique.append(candidate)
    return unique


def probe(python: str) -> str | None:
    """The extension-module suffix of `python` (which build of the compiled gateway it loads), or None
    when it cannot import httptools."""
    try:
        done = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S,
                              check=False, env=supervisord_environment(dict(os.environ)))
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def find_python(settings: Settings, own: str) -> tuple[str, str]:
    """The Python that runs the gateway, and its extension-module suffix."""
    candidates = python_candidates(settings, own)
    for python in candidates:
        if (suffix := probe(python)) is not None:
            return python, suffix
    tried = ", ".join(candidates) or "none found"
    raise BoxGatewayError(f"the box gateway needs a Python that imports httptools (tried: {tried}); set "
                       "FLEETLLM_GATEWAY_PYTHON to one, e.g. the vLLM image's python3")


def running_archive() -> Path | None:
    """The zipapp this code runs from, or None when it runs from a source tree or a wheel."""
    for parent in Path(__file__).parents:
        if parent.is_file():
            return parent if zipfile.is_zipfile(parent) else None
    return None


def box_program() -> bytes:
    """The box program's bytes: the running zipapp, or one built from the packages beside this file."""
    archive = running_archive()
    if archive is not None:
        return archive.read_bytes()
    from fleetllm_installer.zipapp import build_zipapp_bytes

    return build_zipapp_bytes()


def effective_config(spec: GatewaySpec, settings: Settings) -> str:
    """The rendered config with `host` set to where public listeners bind on this box."""
    return json.dumps({**spec.config, "host": settings.listen_host}, indent=2) + "\n"


def credentials(box: BoxConfig, spec: GatewaySpec) -> dict[str, str]:
    found = {CLIENT_TOKEN_CREDENTIAL: spec.api_key}
    found.update({bearer_credential(s.name): s.api_key for s in box.servers})
    return found


def sha256(data: str | bytes) -> str:
    return "sha256:" + hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def native_build(settings: Settings, client: Client | None, python: str, suffix: str) -> gatewaynative.Fetched:
    """The compiled modules for `python` from the control plane (`client`; None: none to ask)."""
    if not settings.gateway_compiled:
        return gatewaynative.Fetched(None, "FLEETLLM_GATEWAY_COMPILED=0")
    if client is None:
        return gatewaynative.Fetched(None, "no control plane to fetch the compiled gateway from")
    tag = tag_of(suffix)
    if tag is None:
        return gatewaynative.Fetched(None, f"{python} loads extension modules ending {suffix[:80]!r}, for which no "
                                           "compiled gateway is made")
    return gatewaynative.fetch(client, settings.gateway_native_dir, tag)


def _unit(settings: Settings, spec: GatewaySpec, python: str, revision: str, config_text: str, program: bytes,
          native: Path | None) -> Unit:
    try:
        return render_gateway_unit(spec, settings=settings, python=python, revision=revision,
                                   config_sha256=sha256(config_text), program_sha256=sha256(program), native=native)
    except UnitError as exc:
        raise BoxGatewayError(f"cannot write the gateway's Supervisor program: {exc}") from None


def plan_gateway(box: BoxConfig, spec: GatewaySpec, settings: Settings, own_python: str,
                 client: Client | None = None) -> GatewayPlan:
    """The gateway's program and files; with `client`, its compiled modules fetched (and unpacked) first."""
    python, suffix = find_python(settings, own_python)
    fetched = native_build(settings, client, python, suffix)
    program, config_text = box_program(), effective_config(spec, settings)
    unit = _unit(settings, spec, python, box.revision, config_text, program, fetched.directory)
    return GatewayPlan(spec, python, program, config_text, credentials(box, spec), unit, fetched.directory,
                       fetched.note, box.revision, fetched.held)


def _run_check(plan: GatewayPlan, native: Path | None) -> str:
    """The gateway's own `--check` of the plan's config, in a temporary directory, with `native` named:
    its output (the verdict line last). Raises BoxGatewayError when the config fails it."""
    env = supervisord_environment(dict(os.environ))
    env[NATIVE_ENV] = str(native) if native is not None else ""
    with tempfile.TemporaryDirectory(prefix="fleetllm-gateway-check-") as directory:
        program, config = Path(directory) / "box.pyz", Path(directory) / "gateway.json"
        program.write_bytes(plan.program)
        config.write_text(plan.config_text, encoding="utf-8")
        try:
            done = subprocess.run([plan.python, str(program), "gateway", "--check", "--box-json", "--config",
                                   str(config)], capture_output=True, text=True, timeout=CHECK_TIMEOUT_S, check=False,
                                  env=env)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise BoxGatewayError(f"cannot run the gateway's --check with {plan.python}: {exc}") from None
    output = (done.stdout + done.stderr).strip().replace(str(config), "gateway.json")
    if done.returncode != 0:
        raise BoxGatewayError(f"the box gateway's config fails its --check: {output}")
    return output


def _why_not(output: str) -> str:
    """The gateway's reason for not running a build, from its --check output (`... (reason=...)`)."""
    said = " ".join(line for line in output.splitlines() if "valid (" not in line)
    return said.split("(reason=", 1)[-1].removesuffix(")")[:600]


def check_config(plan: GatewayPlan, settings: Settings) -> tuple[str, GatewayPlan]:
    """Run the gateway's own `--check` on the config with the compiled modules the plan names (then with
    the build the box held, if the new one does not fit). Returns the verdict, and the plan naming the
    build the gateway said it would run (`; compiled modules` in its verdict), or none (the reason in
    native_note)."""
    output = _run_check(plan, plan.native)
    if plan.native is None or COMPILED_VERDICT in output:
        return output, plan
    note = f"the compiled gateway {plan.native.name[:12]} does not fit: {_why_not(output)}"
    chosen: Path | None = None
    if plan.held is not None:
        again = _run_check(plan, plan.held)
        if COMPILED_VERDICT in again:
            output, chosen = again, plan.held
            note = f"kept the compiled gateway {plan.held.name[:12]}, as {note}"
    unit = _unit(settings, plan.spec, plan.python, plan.revision, plan.config_text, plan.program, chosen)
    return output, replace(plan, unit=unit, native=chosen, native_note=note)


def write_gateway(settings: Settings, plan: GatewayPlan) -> None:
    """The program, the credentials (stale bearers removed), then the config; builds of the compiled
    modules no longer needed removed. Raises OSError."""
    write_atomic(settings.gateway_program_path, plan.program, mode=0o700)
    if plan.native is not None:
        gatewaynative.chosen(plan.native)
    gatewaynative.prune(settings.gateway_native_dir, plan.native)
    directory = settings.credentials_dir
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    for name, secret in plan.credentials.items():
        write_atomic(directory / name, secret + "\n")
    for stale in _credential_files(directory):
        if stale.name not in plan.credentials:
            stale.unlink()
    write_atomic(settings.gateway_config_path, plan.config_text)


def _credential_files(directory: Path) -> list[Path]:
    """Files the installer wrote into the credentials directory (nothing else there is touched)."""
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir()
                  if p.is_file() and (p.name == CLIENT_TOKEN_CREDENTIAL or p.name.startswith(bearer_credential(""))))


def remove_gateway(settings: Settings) -> list[Path]:
    """A box without a gateway: remove its credentials, config, program and compiled modules. Returns what
    was removed."""
    removed = []
    if settings.gateway_native_dir.is_dir():
        shutil.rmtree(settings.gateway_native_dir)
        removed.append(settings.gateway_native_dir)
    for path in (*_credential_files(settings.credentials_dir), settings.gateway_config_path,
                 settings.gateway_program_path):
        if path.is_file():
            path.unlink()
            removed.append(path)
    return removed
