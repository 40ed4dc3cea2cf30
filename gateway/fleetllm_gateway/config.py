"""The gateway's configuration: LLMhop's JSON format accepted as is, plus a few keys of our own.

Pure: text in, an immutable `GatewayConfig` out, or a `ConfigError` listing every problem, each as
`config: <location>: <message>` with LLMhop's wording where LLMhop has one (llmhop.md §7-§8).
Secret references in `authTokens[*]` and `models.*.headers.*` are expanded with `fleetllm_contract.secretref`;
with `expand_secrets=False` (`--check`) only their syntax is checked and nothing is read. With
`box_json=True` (`--box-json`: the installer wrote the config from a box JSON, which the control plane
sends) only `${cred:...}` references are accepted, naming the credentials the installer writes, and every
model url must be on the box (loopback or a unix socket): the box's environment and files are not the
control plane's to send upstream (issue 27; docs/security.md, "The box gateway").
Deviations from LLMhop are listed in gateway/README.md.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetllm_contract import secretref
from fleetllm_contract.addresses import is_loopback
from fleetllm_gateway.errors import GatewayError
from fleetllm_gateway.target import Target, TargetError, parse_target

DEFAULT_PORT = 8080
DEFAULT_MAX_BODY_BYTES = 100 * 1024 * 1024
# Per model (LLMhop: 8 for the whole router, no queue). A model is a vLLM, which batches up to its
# --max-num-seqs requests at once and queues the rest itself: a gateway slot count below that answers 503
# where vLLM would have served. Without a per-model value (fleetllm writes one from the recipe), vLLM
# 0.32's own default for `vllm serve` on an H100-class card (EngineArgs.get_batch_defaults: 1024 on
# cards of 70 GiB or more but A100s, 256 on other GPUs), and as many again may wait in the queue.
DEFAULT_MAX_CONCURRENT = 1024
DEFAULT_MAX_QUEUED = 1024
DEFAULT_QUEUE_TIMEOUT = 30.0
DEFAULT_CONNECT_TIMEOUT = 10.0
DEFAULT_MAX_BUFFERED_BYTES = 256 * 1024 * 1024  # or maxBodyBytes when larger

_TOP_KEYS = frozenset({"host", "port", "maxBodyBytes", "maxConcurrentRequests", "authTokens", "models",
                       "maxQueuedRequests", "queueTimeoutSeconds", "connectTimeoutSeconds", "maxBufferedBytes"})
_MODEL_KEYS = frozenset({"url", "headers", "unlisted", "maxConcurrentRequests", "maxQueuedRequests"})
HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # RFC 9110's token
_HOSTNAME = re.compile(r"(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                       r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?")


class ConfigError(GatewayError, ValueError):
    """The configuration is unusable; `problems` holds one `config: ...` line per problem."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class ModelRoute:
    name: str
    url: str
    target: Target
    # Canonical header name -> value, secrets expanded (raw under --check). Never printed.
    headers: tuple[tuple[str, str], ...] = field(repr=False)
    unlisted: bool = False
    max_concurrent: int = DEFAULT_MAX_CONCURRENT  # 0: no limit
    max_queued: int = DEFAULT_MAX_QUEUED


@dataclass(frozen=True)
class GatewayConfig:
    host: str
    port: int
    max_body_bytes: int  # 0: no cap
    queue_timeout: float  # 0: wait for a slot as long as it takes
    connect_timeout: float
    auth_tokens: tuple[str, ...] = field(repr=False)
    models: tuple[ModelRoute, ...] = ()  # sorted by name
    max_buffered_bytes: int = DEFAULT_MAX_BUFFERED_BYTES  # request bodies held at once; 0: no limit

    @property
    def listed(self) -> tuple[str, ...]:
        """What GET /v1/models advertises and /health counts: every model not `unlisted`, sorted."""
        return tuple(m.name for m in self.models if not m.unlisted)

    @property
    def listen_address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def canonical_header(name: str) -> str:
    """Go's CanonicalHeaderKey: `x-injected` -> `X-Injected` (LLMhop compares header names this way)."""
    return "-".join(part[:1].upper() + part[1:].lower() for part in name.split("-"))


def valid_header_value(value: str) -> bool:
    """No control characters except TAB, no DEL (what Go's HTTP stack would refuse to send)."""
    return not any((ch < " " and ch != "\t") or ch == "\x7f" for ch in value)


def load_config(path: Path, *, expand_secrets: bool = True, env: Mapping[str, str] | None = None,
                box_json: bool = False) -> GatewayConfig:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise ConfigError([f'config: cannot read "{path}": {reason}']) from None
    return parse_config(text, expand_secrets=expand_secrets, env=env, box_json=box_json)


def parse_config(text: str, *, expand_secrets: bool = True, env: Mapping[str, str] | None = None,
                 box_json: bool = False) -> GatewayConfig:
    """Decode, validate and (unless `expand_secrets` is false) resolve secrets, reporting every problem."""
    problems: list[str] = []
    document = _decode(text, problems)
    if problems:
        raise ConfigError([f"config: {p}" for p in problems])
    config = _Reader(problems, expand_secrets, env, box_json).read(document)
    if problems or config is None:
        raise ConfigError([f"config: {p}" for p in problems])
    return config


def _decode(text: str, problems: list[str]) -> Any:
    def reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        for key, value in pairs:
            if key in seen:
                problems.append(f'duplicate key "{key}"')
            seen[key] = value
        return seen

    def reject_constant(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    decoder = json.JSONDecoder(object_pairs_hook=reject_duplicates, parse_constant=reject_constant)
    stripped = text.lstrip(" \t\r\n")
    if not stripped:
        problems.append("empty file: expected a JSON object")
        return None
    try:
        document, end = decoder.raw_decode(stripped)
    except json.JSONDecodeError as exc:
        problems.append(f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}")
        return None
    except (ValueError, RecursionError) as exc:
        problems.append(f"invalid JSON: {exc}")
        return None
    rest = stripped[end:].lstrip(" \t\r\n")
    if rest:
        try:
            decoder.raw_decode(rest)
            problems.append("multiple JSON values in config")
        except (ValueError, RecursionError):
            problems.append("invalid JSON after the top-level value")
    return document


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", int: "a number", float: "a number", str: "a string",
            list: "an array", dict: "an object"}.get(type(value), type(value).__name__)


class _Reader:
    """Walks the decoded document once, appending every problem to `problems`."""

    def __init__(self, problems: list[str], expand_secrets: bool, env: Mapping[str, str] | None,
                 box_json: bool = False) -> None:
        self.problems = problems
        self.expand_secrets = expand_secrets
        self.env = env
        self.box_json = box_json

    def _typed(self, where: str, value: Any, check: Callable[[Any], bool], expected: str) -> bool:
        if check(value):
            return True
        self.problems.append(f"{where}: expected {expected}, got {_kind(value)}")
        return False

    def _int(self, obj: Mapping[str, Any], key: str, default: int, where: str = "") -> int:
        if key not in obj:
            return default
        value = obj[key]
        if not self._typed(f"{where}{key}", value, lambda v: type(v) is int, "an integer"):
            return default
        if value < 0:
            self.problems.append(f"{where}{key} must not be negative")
            return default
        return int(value)

    def _seconds(self, obj: Mapping[str, Any], key: str, default: float, *, zero_ok: bool) -> float:
        if key not in obj:
            return default
        value = obj[key]
        if not self._typed(key, value, lambda v: type(v) in (int, float), "a number of seconds"):
            return default
        if value < 0 or (value == 0 and not zero_ok):
            self.problems.append(f"{key} must be {'at least 0' if zero_ok else 'greater than 0'}")
            return default
        return float(value)

    def _unknown_keys(self, obj: Mapping[str, Any], allowed: frozenset[str], where: str) -> None:
        self.problems.extend(f'{where}unknown field "{key}"' for key in obj if key not in allowed)

    def read(self, document: Any) -> GatewayConfig | None:
        if document is None:  # Go decodes `null` into the zero config
            document = {}
        if not self._typed("top level", document, lambda v: isinstance(v, dict), "an object"):
            return None
        self._unknown_keys(document, _TOP_KEYS, "")
        host = self._host(document.get("host", ""))
        port = DEFAULT_PORT
        if "port" in document and self._typed("port", document["port"], lambda v: type(v) is int, "an integer"):
            port = document["port"]
            if not 0 <= port <= 65535:
                self.problems.append(f"port {port} is outside 0..65535")
        max_body = self._int(document, "maxBodyBytes", DEFAULT_MAX_BODY_BYTES)
        max_buffered = self._int(document, "maxBufferedBytes", max(DEFAULT_MAX_BUFFERED_BYTES, max_body))
        if max_buffered and max_body and max_buffered < max_body:
            self.problems.append(f"maxBufferedBytes ({max_buffered}) must be at least maxBodyBytes ({max_body}), "
                                 "or a body of the largest allowed size could never be read")
        max_concurrent = self._int(document, "maxConcurrentRequests", DEFAULT_MAX_CONCURRENT)
        max_queued = self._int(document, "maxQueuedRequests", DEFAULT_MAX_QUEUED)
        queue_timeout = self._seconds(document, "queueTimeoutSeconds", DEFAULT_QUEUE_TIMEOUT, zero_ok=True)
        connect_timeout = self._seconds(document, "connectTimeoutSeconds", DEFAULT_CONNECT_TIMEOUT, zero_ok=False)
        models_doc = document.get("models")
        models: list[ModelRoute] = []
        if models_doc is None or models_doc == {}:
            self.problems.append("no models configured")
        elif self._typed("models", models_doc, lambda v: isinstance(v, dict), "an object"):
            for name in sorted(models_doc):
                model = self._model(name, models_doc[name], max_concurrent, max_queued)
                if model is not None:
                    models.append(model)
        tokens = self._tokens(document.get("authTokens"))
        if self.problems:
            return None
        return GatewayConfig(host=host, port=port or DEFAULT_PORT, max_body_bytes=max_body,
                             queue_timeout=queue_timeout, connect_timeout=connect_timeout,
                             auth_tokens=tokens, models=tuple(models), max_buffered_bytes=max_buffered)

    def _host(self, host: Any) -> str:
        if not self._typed("host", host, lambda v: isinstance(v, str), "a string"):
            return ""
        if host == "" or _HOSTNAME.fullmatch(host):
            return str(host)
        try:
            ipaddress.ip_address(host)
        except ValueError:
            self.problems.append(f'host "{host}" must be an IP address or a host name, without brackets or port')
        return str(host)

    def _model(self, name: str, doc: Any, max_concurrent: int, max_queued: int) -> ModelRoute | None:
        if name == "":
            self.problems.append("model name must not be empty")
            return None
        where = f"models.{name}"
        if not self._typed(where, doc, lambda v: isinstance(v, dict), "an object"):
            return None
        self._unknown_keys(doc, _MODEL_KEYS, f"{where}: ")
        url = doc.get("url", "")
        target: Target | None = None
        if self._typed(f"{where}.url", url, lambda v: isinstance(v, str), "a string"):
            try:
                target = parse_target(url)
            except TargetError as exc:
                self.problems.append(f"{where}: {exc}")
            if target is not None and self.box_json and not (target.is_unix or is_loopback(target.host)):
                self.problems.append(f"{where}.url: a config from a box JSON routes only to this box's servers "
                                     "(a loopback address or a unix socket)")
                target = None
        unlisted = doc.get("unlisted", False)
        self._typed(f"{where}.unlisted", unlisted, lambda v: isinstance(v, bool), "a boolean")
        headers_doc = doc.get("headers")
        headers = self._headers(where, {} if headers_doc is None else headers_doc)
        limit = self._int(doc, "maxConcurrentRequests", max_concurrent, f"{where}.")
        queued = self._int(doc, "maxQueuedRequests", max_queued, f"{where}.")
        if target is None:
            return None
        return ModelRoute(name=name, url=url, target=target, headers=headers, unlisted=unlisted is True,
                          max_concurrent=limit, max_queued=queued)

    def _headers(self, where: str, doc: Any) -> tuple[tuple[str, str], ...]:
        if not self._typed(f"{where}.headers", doc, lambda v: isinstance(v, dict), "an object"):
            return ()
        headers: list[tuple[str, str]] = []
        seen: set[str] = set()
        for name, raw in doc.items():
            if not HEADER_NAME.fullmatch(name):
                self.problems.append(f'{where}.headers: invalid header name "{name}"')
                continue
            key = canonical_header(name)
            if key in seen:
                self.problems.append(f'{where}.headers: duplicate header "{key}"')
                continue
            seen.add(key)
            if not self._typed(f"{where}.headers.{name}", raw, lambda v: isinstance(v, str), "a string"):
                continue
            value = self._secret(f"{where}.headers.{name}", raw)
            if value is None:
                continue
            if not valid_header_value(value):
                self.problems.append(f"{where}.headers.{name}: invalid header value")
                continue
            headers.append((key, value))
        return tuple(headers)

    def _tokens(self, doc: Any) -> tuple[str, ...]:
        if doc is None:
            return ()
        if not self._typed("authTokens", doc, lambda v: isinstance(v, list), "an array of strings"):
            return ()
        tokens: list[str] = []
        for index, raw in enumerate(doc):
            where = f"authTokens[{index}]"
            if not self._typed(where, raw, lambda v: isinstance(v, str), "a string"):
                continue
            value = self._secret(where, raw)
            if value is None:
                continue
            if value == "":
                self.problems.append(f"{where}: empty token")
            elif not valid_header_value(value):
                self.problems.append(f"{where}: invalid token")
            else:
                tokens.append(value)
        return tuple(tokens)

    def _secret(self, where: str, raw: str) -> str | None:
        """The value with references expanded (or checked only); None after recording a problem."""
        if self.box_json:
            foreign = sorted({str(ref) for ref in secretref.references(raw) if ref.scheme != "cred"})
            if foreign:
                self.problems.extend(f"{where}: {ref} is refused in a config from a box JSON: the box's environment "
                                     "and files are not the control plane's to send; only ${cred:...} references "
                                     "to the credentials the installer writes are read" for ref in foreign)
                return None
        try:
            return secretref.expand(raw, self.env) if self.expand_secrets else _checked(raw)
        except secretref.SecretRefError as exc:
            self.problems.extend(f"{where}: {problem}" for problem in exc.problems)
            return None


def _checked(raw: str) -> str:
    errors = secretref.check(raw)
    if errors:
        raise secretref.SecretRefError(errors)
    return raw
