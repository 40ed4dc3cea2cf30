"""The control plane's config file: strict YAML, a JSON Schema with unknown keys rejected, secrets only
as `${env:}`/`${file:}`/`${cred:}` references resolved at start-up.

`load_config(path)` either returns a complete, typed `ControlPlaneConfig` (every secret resolved) or
raises `ConfigError` listing every problem as `file:line:col: /pointer: message`. No message ever
contains a secret value: problems under a secret field are reworded without echoing the value.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from llmfleet.adapters.state.store import FetchRetention, is_postgres, sqlite_path
from llmfleet.core.fleet import strictyaml
from llmfleet.core.fleet.bearer import Salt, SaltError
from llmfleet.core.fleet.diagnostics import Diagnostic, pointer
from llmfleet.core.fleet.schema import validate_document
from llmfleet_contract import secretref
from llmfleet_contract.addresses import is_loopback

SCHEMA = "control-plane"
DEFAULT_LISTEN = "127.0.0.1:8080"
HOW_TO_REFER = (
    "write it as one reference: ${env:NAME}, ${file:/absolute/path} or ${cred:NAME}, never the value")
_SECRET_POINTERS = ("/repo/webhook_secret", "/secrets", "/state/password", "/admin_tokens", "/viewer_tokens",
                    "/litellm/master_key", "/providers/vast/api_key", "/providers/runpod/api_key")
_NAMING_RULES = ("schema-unknown-key", "schema-required")  # these quote a key, never a value

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class ConfigError(Exception):
    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


class Secret:
    """A resolved secret. repr() and str() are redacted; `reveal()` is the only way to the value."""

    __slots__ = ("_value", "reference")

    def __init__(self, value: str, reference: str) -> None:
        self._value = value
        self.reference = reference  # e.g. ${env:LLMFLEET_FLEET_KEY}: safe to show

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return f"Secret({self.reference})"

    __str__ = __repr__


class ApproveTarget(StrEnum):
    BRANCH = "branch"  # a new branch approve/<host> per approval
    TRACKED = "tracked"  # straight onto the tracked branch


@dataclass(frozen=True)
class RepoConfig:
    url: str | None
    path: Path | None
    branch: str = "main"
    subdir: str | None = None
    refresh_interval_s: float = 60.0
    clone_dir: Path | None = None
    webhook_secret: Secret | None = None
    approve_target: ApproveTarget = ApproveTarget.BRANCH


@dataclass(frozen=True)
class Secrets:
    vllm_api_salt: Salt
    fleet_key: Secret | None = None
    legacy_api_key: Secret | None = None
    previous_vllm_api_salt: Salt | None = None  # a salt rotation in progress, box by box


@dataclass(frozen=True)
class Listen:
    host: str
    port: int

    @property
    def is_loopback(self) -> bool:
        return is_loopback(self.host)

    @property
    def bind(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @classmethod
    def parse(cls, text: str) -> Listen:
        host, _, port = text.rpartition(":")
        host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
        if not host or not port.isdigit() or not 0 <= int(port) < 65536:
            raise ValueError(f"{text!r} is not HOST:PORT with a port in 0..65535")
        return cls(host, int(port))


@dataclass(frozen=True)
class TlsConfig:
    cert: Path
    key: Path


@dataclass(frozen=True)
class StateConfig:
    url: str  # sqlite:///PATH or postgresql://user@host:port/dbname (never with a password in it)
    base: Path  # relative sqlite paths are taken from here
    password: Secret | None = None  # PostgreSQL's, from a reference
    fetch_log_max_rows: int = 200_000
    fetch_log_max_age_days: float = 30.0
    reports_per_box: int = 20

    @property
    def retention(self) -> FetchRetention:
        return FetchRetention(self.fetch_log_max_rows, self.fetch_log_max_age_days * 86400.0)


@dataclass(frozen=True)
class LitellmConfig:
    url: str
    master_key: Secret | None = None
    timeout_s: float = 30.0
    write_concurrency: int = 4


@dataclass(frozen=True)
class ProviderConfig:
    api_key: Secret
    url: str | None = None  # None: the provider's public API


@dataclass(frozen=True)
class ProvidersConfig:
    vast: ProviderConfig | None = None
    runpod: ProviderConfig | None = None
    static: bool = False


@dataclass(frozen=True)
class ReconcileConfig:
    enabled: bool = True
    dry_run: bool = False


@dataclass(frozen=True)
class ControlPlaneConfig:
    source: Path
    repo: RepoConfig
    secrets: Secrets
    state: StateConfig
    listen: Listen = field(default_factory=lambda: Listen.parse(DEFAULT_LISTEN))
    tls: TlsConfig | None = None
    trusted_proxies: tuple[IPNetwork, ...] = ()
    admin_tokens: tuple[Secret, ...] = ()
    viewer_tokens: tuple[Secret, ...] = ()
    attention_max_entries: int = 200
    threads: int = 8
    timeout_s: int = 60
    litellm: LitellmConfig | None = None
    providers: ProvidersConfig = field(default_factory=ProvidersConfig)
    reconcile: ReconcileConfig = field(default_factory=ReconcileConfig)


def _redacted(diagnostic: Diagnostic) -> Diagnostic:
    """Schema messages quote the offending value; under a secret field that could be the secret."""
    where = diagnostic.pointer
    secret = any(where == p or where.startswith(p + "/") for p in _SECRET_POINTERS)
    if not secret or diagnostic.rule in _NAMING_RULES:
        return diagnostic
    message = f"not a secret reference: {HOW_TO_REFER}"
    return Diagnostic(diagnostic.file, diagnostic.line, diagnostic.column, diagnostic.pointer, message,
                      diagnostic.rule, diagnostic.severity)


class _Builder:
    """Turns the schema-valid document into the typed config, collecting every problem."""

    def __init__(self, doc: strictyaml.Document, base: Path, env: Mapping[str, str] | None) -> None:
        self.doc = doc
        self.base = base
        self.env = env
        self.problems: list[str] = []

    def problem(self, path: list[str | int], message: str) -> None:
        mark = self.doc.mark_at(path)
        self.problems.append(f"{self.doc.path}:{mark.line}:{mark.column}: {pointer(path)}: {message}")

    def secret(self, value: Any, path: list[str | int]) -> Secret | None:
        if value is None:
            return None
        try:
            return Secret(secretref.expand(value, self.env), value)
        except secretref.SecretRefError as exc:
            self.problem(path, f"{value}: {exc}")
            return None

    def path(self, value: str | None) -> Path | None:
        if value is None:
            return None
        candidate = Path(os.path.expanduser(value))
        return Path(os.path.normpath(candidate if candidate.is_absolute() else self.base / candidate))

    def repo(self, raw: dict[str, Any]) -> RepoConfig:
        url, path = raw.get("url"), raw.get("path")
        if (url is None) == (path is None):
            self.problem(["repo"], "give exactly one of url (a remote to clone) or path (a local repository)")
        target = ApproveTarget(raw.get("approve", {}).get("target", ApproveTarget.BRANCH))
        if target is ApproveTarget.TRACKED and url is not None:
            self.problem(["repo", "approve", "target"], "approve.target: tracked needs a local path repository; "
                         "with a url the control plane cannot push, so approvals go on new branches")
        return RepoConfig(url=url, path=self.path(path), branch=raw.get("branch", "main"), subdir=raw.get("subdir"),
                          refresh_interval_s=float(raw.get("refresh_interval_s", 60)),
                          clone_dir=self.path(raw.get("clone_dir")),
                          webhook_secret=self.secret(raw.get("webhook_secret"), ["repo", "webhook_secret"]),
                          approve_target=target)

    def secrets(self, raw: dict[str, Any]) -> Secrets | None:
        salt_secret = self.secret(raw["vllm_api_salt"], ["secrets", "vllm_api_salt"])
        fleet_key = self.secret(raw.get("fleet_key"), ["secrets", "fleet_key"])
        legacy = self.secret(raw.get("legacy_api_key"), ["secrets", "legacy_api_key"])
        if fleet_key is not None and not fleet_key.reveal():
            self.problem(["secrets", "fleet_key"], f"{fleet_key.reference} is empty; leave fleet_key out to "
                         "refuse every box (503) instead")
        if legacy is not None and legacy.reveal() != legacy.reveal().strip():
            self.problem(["secrets", "legacy_api_key"], f"{legacy.reference} has leading or trailing whitespace")
        if salt_secret is None:
            return None
        try:
            salt = Salt(salt_secret.reveal())
        except SaltError as exc:
            self.problem(["secrets", "vllm_api_salt"], f"{salt_secret.reference}: {exc}")
            return None
        return Secrets(salt, fleet_key, legacy if legacy is None or legacy.reveal() else None,
                       self.previous_salt(raw.get("previous_vllm_api_salt")))

    def previous_salt(self, value: str | None) -> Salt | None:
        secret = self.secret(value, ["secrets", "previous_vllm_api_salt"])
        if secret is None:
            return None
        try:
            return Salt(secret.reveal())
        except SaltError as exc:
            self.problem(["secrets", "previous_vllm_api_salt"], f"{secret.reference}: {exc}")
            return None

    def tokens(self, raw: list[str], key: str) -> tuple[Secret, ...]:
        tokens = [self.secret(value, [key, i]) for i, value in enumerate(raw)]
        for i, token in enumerate(tokens):
            if token is not None and len(token.reveal()) < 16:
                self.problem([key, i], f"{token.reference} is shorter than 16 characters")
        return tuple(t for t in tokens if t is not None)

    def networks(self, raw: list[str]) -> tuple[IPNetwork, ...]:
        networks: list[IPNetwork] = []
        for i, text in enumerate(raw):
            try:
                networks.append(ipaddress.ip_network(text, strict=False))
            except ValueError:
                self.problem(["trusted_proxies", i], f"{text!r} is not an address range such as 10.0.0.0/8 or ::1")
        return tuple(networks)

    def state(self, raw: dict[str, Any]) -> StateConfig:
        url = raw["url"]
        password = self.secret(raw.get("password"), ["state", "password"])
        if is_postgres(url):
            try:
                has_password = bool(urlsplit(url).password)
            except ValueError:
                has_password = False  # PostgreSQL will say what is wrong with it, without the URL
            if has_password:
                self.problem(["state", "url"], "the URL carries a password: take it out and give it as "
                             "state.password: ${cred:NAME} (or ${env:NAME}, ${file:/path})")
        elif raw.get("password") is not None:
            self.problem(["state", "password"], "a password is only for a postgresql:// state url")
        return StateConfig(url, self.base, password, raw.get("fetch_log_max_rows", 200_000),
                           float(raw.get("fetch_log_max_age_days", 30)), raw.get("reports_per_box", 20))

    def providers(self, raw: dict[str, Any]) -> ProvidersConfig:
        def one(name: str) -> ProviderConfig | None:
            section = raw.get(name)
            if section is None:
                return None
            key = self.secret(section["api_key"], ["providers", name, "api_key"])
            return ProviderConfig(key, section.get("url")) if key is not None else None

        return ProvidersConfig(vast=one("vast"), runpod=one("runpod"), static="static" in raw)

    def build(self) -> ControlPlaneConfig | None:
        raw: dict[str, Any] = self.doc.value  # type: ignore[assignment]  # schema-checked mapping
        repo = self.repo(raw["repo"])
        secrets = self.secrets(raw["secrets"])
        listen = Listen.parse(DEFAULT_LISTEN)
        try:
            listen = Listen.parse(raw.get("listen", DEFAULT_LISTEN))
        except ValueError as exc:
            self.problem(["listen"], str(exc))
        tls_raw = raw.get("tls")
        tls = None
        if tls_raw is not None:
            cert, key = self.path(tls_raw["cert"]), self.path(tls_raw["key"])
            assert cert is not None
            assert key is not None
            for name, file in (("cert", cert), ("key", key)):
                if not file.is_file():
                    self.problem(["tls", name], f"{file}: no such file")
            tls = TlsConfig(cert, key)
        state = self.state(raw["state"])
        litellm_raw = raw.get("litellm")
        litellm = None if litellm_raw is None else LitellmConfig(
            litellm_raw["url"], self.secret(litellm_raw.get("master_key"), ["litellm", "master_key"]),
            float(litellm_raw.get("timeout_s", 30)), litellm_raw.get("write_concurrency", 4))
        reconcile_raw = raw.get("reconcile", {})
        server = raw.get("server", {})
        config = ControlPlaneConfig(
            source=Path(self.doc.path), repo=repo, secrets=secrets,  # type: ignore[arg-type]  # checked below
            state=state, listen=listen, tls=tls, trusted_proxies=self.networks(raw.get("trusted_proxies", [])),
            admin_tokens=self.tokens(raw.get("admin_tokens", []), "admin_tokens"),
            viewer_tokens=self.tokens(raw.get("viewer_tokens", []), "viewer_tokens"),
            attention_max_entries=raw.get("attention", {}).get("max_entries", 200),
            threads=server.get("threads", 8), timeout_s=server.get("timeout_s", 60), litellm=litellm,
            providers=self.providers(raw.get("providers", {})),
            reconcile=ReconcileConfig(reconcile_raw.get("enabled", True), reconcile_raw.get("dry_run", False)))
        return None if self.problems or secrets is None else config


def load_config(path: str | os.PathLike[str], env: Mapping[str, str] | None = None) -> ControlPlaneConfig:
    """Read, validate and resolve the config file. Raises ConfigError with every problem found."""
    display = os.fspath(path)
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError([f"{display}: cannot read the config file: {exc.strerror}"]) from None
    doc = strictyaml.load(data, display)
    problems = [f"{display}:{p.mark.line}:{p.mark.column}: {p.message} [{p.rule}]" for p in doc.problems]
    if doc.root is None or doc.empty:
        raise ConfigError(problems or [f"{display}: the config file is empty; it needs repo, secrets and state"])
    diagnostics, _ = validate_document(doc, SCHEMA)
    problems.extend(_redacted(d).text() for d in sorted(diagnostics))
    if problems:
        raise ConfigError(problems)
    builder = _Builder(doc, Path(display).resolve().parent, env)
    config = builder.build()
    if config is None:
        raise ConfigError(builder.problems)
    return config


def default_clone_dir(config: ControlPlaneConfig, name: str = "fleet-repo.git") -> Path:
    """Where a remote repository is cloned when repo.clone_dir is not set: beside the SQLite state file (or
    the config file when the store is in memory or PostgreSQL)."""
    db = None if is_postgres(config.state.url) else sqlite_path(config.state.url, config.state.base)
    return (db.parent if db is not None else config.source.resolve().parent) / name
