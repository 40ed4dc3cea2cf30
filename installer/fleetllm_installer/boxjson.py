"""The box JSON (GET /vllm/config), checked by hand before anything acts on it.

Standard library only, so no jsonschema: each problem names the field (`servers[1].port`) and what
was expected. Values are never echoed for `api_key`. The shape is the box contract's; `revision`,
per-server `digest` and `listen_host`, and the box gateway (`gateway`) are fleetllm's additions
(optional, so an llmao control plane still works).
"""

from __future__ import annotations

import ipaddress
import json
import math
import re
import shlex
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from fleetllm_contract import secretref, vllmflags
from fleetllm_contract.addresses import is_loopback
from fleetllm_contract.boxjson import (
    AGENT_POLL_S,
    AGENT_PROGRAM,
    BEARER,
    CLIENT_TOKEN_CREDENTIAL,
    GATEWAY_PROGRAM,
    NAME,
    bearer_credential,
)
from fleetllm_installer.errors import InstallerError

ENV_SAFE = re.compile(r"^[A-Za-z0-9_./+:=,@-]*\Z")  # what Supervisor's `environment=` carries unquoted


# Bounds on what the box JSON may hold (the fleet schema's own bounds, schemas/models.schema.json), so that
# no arithmetic on them overflows and no value is too long to report back.
MAX_GB = 1_000_000.0
MAX_CONTEXT = 16_777_216
MAX_KV_BYTES_PER_TOKEN = 1 << 30
MAX_SERVERS = 64  # the report's limit (schemas/box-report.schema.json); a fleet allows 16 per box
MAX_DIGEST = 128
MAX_DEPTH = 64  # nesting of the decoded document (the gateway's config is the deepest part)
MAX_SHOWN = 80  # characters of a refused value quoted in a problem


class BoxJsonError(InstallerError, ValueError):
    """The JSON is not a usable box config; `problems` lists every problem found."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class ServerSpec:
    name: str
    model: str
    served_model_name: str | None
    port: int
    api_key: str
    args: tuple[str, ...]
    gpu_memory_utilization: float | None = None
    max_model_len: int | None = None
    vram_gb: float | None = None
    disk_gb: float | None = None
    kv_bytes_per_token: int | None = None
    digest: str = ""
    listen_host: str | None = None  # set behind a box gateway (loopback); else the installer's setting

    def __repr__(self) -> str:  # keep the bearer out of reprs and tracebacks
        return f"ServerSpec(name={self.name!r}, model={self.model!r}, port={self.port})"


@dataclass(frozen=True)
class GatewaySpec:
    """The box gateway: its public port, client bearer, and config (LLMhop format, no secrets in it)."""

    port: int
    api_key: str
    config: Mapping[str, Any]
    digest: str = ""

    def __repr__(self) -> str:
        return f"GatewaySpec(port={self.port})"


@dataclass(frozen=True)
class AgentSpec:
    """The box agent (`"agent": {"poll_s": N}`): installed when present, removed when absent."""

    poll_s: int


@dataclass(frozen=True)
class BoxConfig:
    host: str
    revision: str
    servers: tuple[ServerSpec, ...]
    gateway: GatewaySpec | None = None
    agent: AgentSpec | None = None
    report_key: str | None = None  # sent with POST /vllm/report (X-Fleetllm-Report-Key); None: an older plane


def _is_number(value: Any) -> bool:
    """A finite JSON number (math.isfinite would overflow on an integer beyond a float's range)."""
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _shown(value: Any) -> str:
    """A refused value for a problem message: JSON, cut short (a control plane may send anything)."""
    try:
        text = json.dumps(value)
    except (ValueError, TypeError, RecursionError):
        text = f"<{type(value).__name__}>"
    return text if len(text) <= MAX_SHOWN else text[:MAX_SHOWN - 3] + "..."


def _text(value: Any) -> bool:
    return isinstance(value, str) and value != "" and not any(ch in value for ch in "\r\n\0")


def _args(where: str, value: Any, problems: list[str]) -> tuple[str, ...]:
    if isinstance(value, str):
        try:
            args: list[Any] = shlex.split(value)
        except ValueError as exc:
            problems.append(f"{where}: cannot split the argument string ({exc})")
            return ()
    elif isinstance(value, list):
        args = value
    else:
        problems.append(f"{where}: expected a list of strings or one string")
        return ()
    good: list[str] = []
    for i, arg in enumerate(args):
        if not isinstance(arg, str) or any(ch in arg for ch in "\r\n\0"):
            problems.append(f"{where}[{i}]: expected a string without line breaks")
            continue
        flag = vllmflags.managed_flag(arg)
        if flag is not None:
            problems.append(f"{where}[{i}]: {vllmflags.explain(arg, flag)}")
        good.append(arg)
    return tuple(good)


def _optional(entry: Mapping[str, Any], where: str, problems: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    checks: dict[str, tuple[Callable[[Any], bool], str]] = {
        "gpu_memory_utilization": (lambda v: _is_number(v) and 0 < v <= 1, "a number in (0, 1]"),
        "max_model_len": (lambda v: _is_int(v) and 0 < v <= MAX_CONTEXT, f"an integer 1-{MAX_CONTEXT}"),
        "vram_gb": (lambda v: _is_number(v) and 0 <= v <= MAX_GB, f"a number 0-{MAX_GB:.0f}"),
        "disk_gb": (lambda v: _is_number(v) and 0 <= v <= MAX_GB, f"a number 0-{MAX_GB:.0f}"),
        "kv_bytes_per_token": (lambda v: _is_int(v) and 0 < v <= MAX_KV_BYTES_PER_TOKEN,
                               f"an integer 1-{MAX_KV_BYTES_PER_TOKEN}"),
    }
    for field, (ok, expected) in checks.items():
        if field not in entry or entry[field] is None:
            continue
        if not ok(entry[field]):
            problems.append(f"{where}.{field}: expected {expected}, got {_shown(entry[field])}")
        else:
            out[field] = entry[field]
    return out


def _server(entry: Any, where: str, problems: list[str]) -> ServerSpec | None:
    if not isinstance(entry, dict):
        problems.append(f"{where}: expected an object")
        return None
    before = len(problems)
    name: Any = entry.get("name")
    model: Any = entry.get("model")
    port: Any = entry.get("port")
    key: Any = entry.get("api_key")
    if not isinstance(name, str) or not NAME.match(name):
        problems.append(f"{where}.name: expected 1-64 letters, digits and ._- starting with a letter or digit, "
                        f"got {_shown(name)}")
    if not _text(model) or any(ch.isspace() for ch in model):
        problems.append(f"{where}.model: expected a model id or path without whitespace, got {_shown(model)}")
    elif vllmflags.option_like(model):
        problems.append(vllmflags.option_like_problem(f"{where}.model"))
    served: Any = entry.get("served_model_name")
    if served is not None and (not _text(served) or any(ch.isspace() for ch in served)):
        problems.append(f"{where}.served_model_name: expected a name without whitespace, got {_shown(served)}")
    elif served is not None and vllmflags.option_like(served):
        problems.append(vllmflags.option_like_problem(f"{where}.served_model_name"))
    if not _is_int(port) or not 0 < port < 65536:
        problems.append(f"{where}.port: expected an integer 1-65535, got {_shown(port)}")
    if not isinstance(key, str) or not BEARER.match(key):
        problems.append(f"{where}.api_key: expected 8-512 characters of A-Z a-z 0-9 _.+/=:@- (value not shown)")
    digest = entry.get("digest", "")
    if not isinstance(digest, str) or len(digest) > MAX_DIGEST or not ENV_SAFE.match(digest):
        problems.append(f"{where}.digest: expected a string of at most {MAX_DIGEST} letters, digits and _./+:=,@-")
    listen_host: Any = entry.get("listen_host")
    if listen_host is not None and not _ip_address(listen_host):
        problems.append(f"{where}.listen_host: expected an IP address, got {_shown(listen_host)}")
    args = _args(f"{where}.args", entry.get("args", []), problems)
    optional = _optional(entry, where, problems)
    if len(problems) > before:
        return None
    return ServerSpec(name=name, model=model, served_model_name=served, port=port, api_key=key, args=args,
                      digest=digest, listen_host=listen_host, **optional)


def _ip_address(value: Any) -> bool:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return isinstance(value, str)


def _strings(value: Any) -> list[str]:
    """Every string anywhere in a decoded JSON value."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for item in value.values() for s in _strings(item)]
    if isinstance(value, list):
        return [s for item in value for s in _strings(item)]
    return []


def _strings_at(value: Any, where: str) -> list[tuple[str, str]]:
    """(field, string) for every string anywhere in a decoded JSON value, the field named as in a problem."""
    if isinstance(value, str):
        return [(where, value)]
    if isinstance(value, dict):
        return [found for key, item in value.items() for found in _strings_at(item, f"{where}.{key}")]
    if isinstance(value, list):
        return [found for i, item in enumerate(value) for found in _strings_at(item, f"{where}[{i}]")]
    return []


def _gateway_reach(config: dict[str, Any], problems: list[str]) -> None:
    """What the gateway would read and where it would send it: only the credentials the installer writes
    (`${env:...}` and `${file:...}` would send the box's environment or files upstream) and only to this
    box (a model url on loopback or a unix socket). The gateway refuses the same with --box-json."""
    problems.extend(f"{where}: {ref} is refused in a box JSON: the box's environment and files are not the "
                    "control plane's to send; only ${cred:...} references are read"
                    for where, text in _strings_at(config, "gateway.config")
                    for ref in secretref.references(text) if ref.scheme != "cred")
    models = config.get("models")
    for name, model in (models.items() if isinstance(models, dict) else ()):
        url = model.get("url") if isinstance(model, dict) else None
        if not isinstance(url, str):
            continue
        try:
            parts = urllib.parse.urlsplit(url)
            local = parts.scheme == "unix" or (parts.scheme in ("http", "https") and is_loopback(parts.hostname or ""))
        except ValueError:  # a malformed url (the gateway's --check names its own problem)
            local = False
        if not local:
            problems.append(f"gateway.config.models.{name}.url: the box gateway routes only to this box's servers "
                            f"(a loopback address or a unix socket), got {_shown(url)}")


def _gateway(entry: Any, servers: list[ServerSpec], problems: list[str]) -> GatewaySpec | None:
    """The box gateway. Its config is checked here only for what the installer relies on; the gateway's
    own `--check` judges the rest."""
    if not isinstance(entry, dict):
        problems.append("gateway: expected an object")
        return None
    before = len(problems)
    port: Any = entry.get("port")
    key: Any = entry.get("api_key")
    config: Any = entry.get("config")
    digest: Any = entry.get("digest", "")
    if not _is_int(port) or not 0 < port < 65536:
        problems.append(f"gateway.port: expected an integer 1-65535, got {_shown(port)}")
    elif port in {s.port for s in servers}:
        problems.append(f"gateway.port: {port} is also a server's port")
    if not isinstance(key, str) or not BEARER.match(key):
        problems.append("gateway.api_key: expected 8-512 characters of A-Z a-z 0-9 _.+/=:@- (value not shown)")
    if not isinstance(digest, str) or len(digest) > MAX_DIGEST or not ENV_SAFE.match(digest):
        problems.append(f"gateway.digest: expected a string of at most {MAX_DIGEST} letters, digits and _./+:=,@-")
    if not isinstance(config, dict):
        problems.append("gateway.config: expected an object")
    else:
        if config.get("port") != port:
            problems.append(f"gateway.config.port: expected the gateway's port {_shown(port)}, "
                            f"got {_shown(config.get('port'))}")
        # The installer writes exactly these credentials; a config naming another would fail at start-up.
        known = {CLIENT_TOKEN_CREDENTIAL, *(bearer_credential(s.name) for s in servers)}
        unknown = sorted({ref.name for text in _strings(config) for ref in secretref.references(text)
                          if ref.scheme == "cred" and ref.name not in known})
        problems.extend(f"gateway.config: credential {name!r} is neither {CLIENT_TOKEN_CREDENTIAL!r} nor "
                        "bearer-<server> of a server in this JSON" for name in unknown)
        _gateway_reach(config, problems)
    if any(s.name == GATEWAY_PROGRAM for s in servers):
        problems.append(f"servers: a server named {GATEWAY_PROGRAM!r} would take the gateway's program name")
    if len(problems) > before:
        return None
    return GatewaySpec(port=port, api_key=key, config=config, digest=digest)


def _agent(entry: Any, servers: list[ServerSpec], problems: list[str]) -> AgentSpec | None:
    low, high = AGENT_POLL_S
    if not isinstance(entry, dict):
        problems.append("agent: expected an object")
        return None
    poll: Any = entry.get("poll_s")
    before = len(problems)
    if not _is_int(poll) or not low <= poll <= high:
        problems.append(f"agent.poll_s: expected an integer {low}-{high}, got {_shown(poll)}")
    if any(s.name == AGENT_PROGRAM for s in servers):
        problems.append(f"servers: a server named {AGENT_PROGRAM!r} would take the box agent's program name")
    return AgentSpec(poll_s=poll) if len(problems) == before else None


def parse_box(document: Any, expected_host: str | None = None) -> BoxConfig:
    """Validate a decoded box JSON document. Raises BoxJsonError listing every problem."""
    if not isinstance(document, dict):
        raise BoxJsonError(["the box JSON must be an object with \"host\" and \"servers\""])
    problems: list[str] = []
    if "error" in document and "servers" not in document:
        raise BoxJsonError([f"the control plane answered an error: {_shown(document['error'])}"])
    host = document.get("host")
    if not _text(host):
        problems.append(f"host: expected a non-empty string, got {_shown(host)}")
    elif expected_host is not None and host != expected_host:
        problems.append(f"host: the JSON is for {host!r} but this box is {expected_host!r} (LLMAO_HOST)")
    revision = document.get("revision", "unknown")
    if not _text(revision) or len(revision) > MAX_DIGEST:
        problems.append(f"revision: expected a non-empty string, got {_shown(revision)}")
    raw_servers = document.get("servers")
    servers: list[ServerSpec] = []
    if not isinstance(raw_servers, list):
        problems.append("servers: expected a list")
    elif len(raw_servers) > MAX_SERVERS:
        problems.append(f"servers: {len(raw_servers)} servers; a box runs at most {MAX_SERVERS}")
    else:
        for i, entry in enumerate(raw_servers):
            spec = _server(entry, f"servers[{i}]", problems)
            if spec is not None:
                servers.append(spec)
    for field, label in (("name", "name"), ("port", "port")):
        seen: set[object] = set()
        for spec in servers:
            value = getattr(spec, field)
            if value in seen:
                problems.append(f"servers: {label} {value} appears twice")
            seen.add(value)
    gateway = _gateway(document["gateway"], servers, problems) if document.get("gateway") is not None else None
    agent = _agent(document["agent"], servers, problems) if document.get("agent") is not None else None
    if problems:
        raise BoxJsonError(problems)
    assert isinstance(host, str)
    assert isinstance(revision, str)
    report_key = document.get("report_key")
    return BoxConfig(host=host, revision=revision, servers=tuple(sorted(servers, key=lambda s: s.name)),
                     gateway=gateway, agent=agent,
                     report_key=report_key if isinstance(report_key, str) and report_key.isascii()
                     and report_key.isprintable() and len(report_key) <= 200 else None)


def parse_text(text: str, expected_host: str | None = None, source: str = "the box JSON") -> BoxConfig:
    try:
        document = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise BoxJsonError([f"{source} is not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"]) from None
    except ValueError as exc:  # an integer of more than 4,300 digits, NaN or Infinity
        raise BoxJsonError([f"{source} is not usable JSON: {exc}"]) from None
    except RecursionError:
        raise BoxJsonError([f"{source} is nested too deeply (the limit is {MAX_DEPTH} levels)"]) from None
    if _depth_exceeds(document, MAX_DEPTH):
        raise BoxJsonError([f"{source} is nested too deeply (the limit is {MAX_DEPTH} levels)"])
    return parse_box(document, expected_host)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _depth_exceeds(document: Any, limit: int) -> bool:
    """True when lists and objects nest deeper than `limit` (iterative: no recursion to exhaust)."""
    stack: list[tuple[Any, int]] = [(document, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, (dict, list)):
            if depth > limit:
                return True
            stack.extend((item, depth + 1) for item in (value.values() if isinstance(value, dict) else value))
    return False
