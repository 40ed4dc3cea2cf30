"""The box JSON (GET /vllm/config), checked by hand before anything acts on it.

Standard library only, so no jsonschema: each problem names the field (`servers[1].port`) and what
was expected. Values are never echoed for `api_key`. The shape is the box contract's; `revision`,
per-server `digest` and `listen_host`, and the box gateway (`gateway`) are llmfleet's additions
(optional, so an llmao control plane still works).
"""

from __future__ import annotations

import ipaddress
import json
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from llmfleet_contract import secretref
from llmfleet_contract.boxjson import (
    BEARER,
    CLIENT_TOKEN_CREDENTIAL,
    GATEWAY_PROGRAM,
    MANAGED_FLAGS,
    NAME,
    bearer_credential,
)


class BoxJsonError(ValueError):
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
class BoxConfig:
    host: str
    revision: str
    servers: tuple[ServerSpec, ...]
    gateway: GatewaySpec | None = None


def _flag_name(token: str) -> str | None:
    if not token.startswith("--") or len(token) == 2:
        return None
    name = token[2:].split("=", 1)[0].replace("_", "-").lower()
    return name[3:] if name.startswith("no-") else name


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


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
        flag = _flag_name(arg)
        if flag in MANAGED_FLAGS:
            problems.append(f"{where}[{i}]: {arg.split('=', 1)[0]} is set by the installer, not by args")
        good.append(arg)
    return tuple(good)


def _optional(entry: Mapping[str, Any], where: str, problems: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    checks: dict[str, tuple[Callable[[Any], bool], str]] = {
        "gpu_memory_utilization": (lambda v: _is_number(v) and 0 < v <= 1, "a number in (0, 1]"),
        "max_model_len": (lambda v: _is_int(v) and v > 0, "a positive integer"),
        "vram_gb": (lambda v: _is_number(v) and v >= 0, "a number >= 0"),
        "disk_gb": (lambda v: _is_number(v) and v >= 0, "a number >= 0"),
        "kv_bytes_per_token": (lambda v: _is_int(v) and v > 0, "a positive integer"),
    }
    for field, (ok, expected) in checks.items():
        if field not in entry or entry[field] is None:
            continue
        if not ok(entry[field]):
            problems.append(f"{where}.{field}: expected {expected}, got {json.dumps(entry[field])}")
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
                        f"got {json.dumps(name)}")
    if not _text(model) or any(ch.isspace() for ch in model):
        problems.append(f"{where}.model: expected a model id or path without whitespace, got {json.dumps(model)}")
    served: Any = entry.get("served_model_name")
    if served is not None and (not _text(served) or any(ch.isspace() for ch in served)):
        problems.append(f"{where}.served_model_name: expected a name without whitespace, got {json.dumps(served)}")
    if not _is_int(port) or not 0 < port < 65536:
        problems.append(f"{where}.port: expected an integer 1-65535, got {json.dumps(port)}")
    if not isinstance(key, str) or not BEARER.match(key):
        problems.append(f"{where}.api_key: expected 8-512 characters of A-Z a-z 0-9 _.+/=:@- (value not shown)")
    digest = entry.get("digest", "")
    if not isinstance(digest, str):
        problems.append(f"{where}.digest: expected a string")
    listen_host: Any = entry.get("listen_host")
    if listen_host is not None and not _ip_address(listen_host):
        problems.append(f"{where}.listen_host: expected an IP address, got {json.dumps(listen_host)}")
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
        problems.append(f"gateway.port: expected an integer 1-65535, got {json.dumps(port)}")
    elif port in {s.port for s in servers}:
        problems.append(f"gateway.port: {port} is also a server's port")
    if not isinstance(key, str) or not BEARER.match(key):
        problems.append("gateway.api_key: expected 8-512 characters of A-Z a-z 0-9 _.+/=:@- (value not shown)")
    if not isinstance(digest, str):
        problems.append("gateway.digest: expected a string")
    if not isinstance(config, dict):
        problems.append("gateway.config: expected an object")
    else:
        if config.get("port") != port:
            problems.append(f"gateway.config.port: expected the gateway's port {json.dumps(port)}, "
                            f"got {json.dumps(config.get('port'))}")
        # The installer writes exactly these credentials; a config naming another would fail at start-up.
        known = {CLIENT_TOKEN_CREDENTIAL, *(bearer_credential(s.name) for s in servers)}
        unknown = sorted({ref.name for text in _strings(config) for ref in secretref.references(text)
                          if ref.scheme == "cred" and ref.name not in known})
        problems.extend(f"gateway.config: credential {name!r} is neither {CLIENT_TOKEN_CREDENTIAL!r} nor "
                        "bearer-<server> of a server in this JSON" for name in unknown)
    if any(s.name == GATEWAY_PROGRAM for s in servers):
        problems.append(f"servers: a server named {GATEWAY_PROGRAM!r} would take the gateway's program name")
    if len(problems) > before:
        return None
    return GatewaySpec(port=port, api_key=key, config=config, digest=digest)


def parse_box(document: Any, expected_host: str | None = None) -> BoxConfig:
    """Validate a decoded box JSON document. Raises BoxJsonError listing every problem."""
    if not isinstance(document, dict):
        raise BoxJsonError(["the box JSON must be an object with \"host\" and \"servers\""])
    problems: list[str] = []
    if "error" in document and "servers" not in document:
        raise BoxJsonError([f"the control plane answered an error: {json.dumps(document['error'])[:200]}"])
    host = document.get("host")
    if not _text(host):
        problems.append(f"host: expected a non-empty string, got {json.dumps(host)}")
    elif expected_host is not None and host != expected_host:
        problems.append(f"host: the JSON is for {host!r} but this box is {expected_host!r} (LLMAO_HOST)")
    revision = document.get("revision", "unknown")
    if not _text(revision):
        problems.append(f"revision: expected a non-empty string, got {json.dumps(revision)}")
    raw_servers = document.get("servers")
    servers: list[ServerSpec] = []
    if not isinstance(raw_servers, list):
        problems.append("servers: expected a list")
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
    if problems:
        raise BoxJsonError(problems)
    assert isinstance(host, str)
    assert isinstance(revision, str)
    return BoxConfig(host=host, revision=revision, servers=tuple(sorted(servers, key=lambda s: s.name)),
                     gateway=gateway)


def parse_text(text: str, expected_host: str | None = None, source: str = "the box JSON") -> BoxConfig:
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BoxJsonError([f"{source} is not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"]) from None
    return parse_box(document, expected_host)
