"""The one settings object of the control plane, the reconciler and the CLI, and its one builder.

The config file is strict YAML checked against schemas/control-plane.schema.json (unknown keys rejected),
secrets only as `${env:}`/`${file:}`/`${cred:}` references resolved at start-up into `Secret`s, which
stay wrapped until the constructor of the client that puts them on the wire.

`load_config(path)` either returns a complete, typed `ControlPlaneConfig` (every secret resolved) or
raises `ConfigurationError` listing every problem as `file:line:col: /pointer: message`.
`settings_from_env(env)` builds the same object for a job without a config file (`fleetllm plan` with no
--config and none found by fleetllm.cli.common.find_config) from LITELLM_URL, LITELLM_MASTER_KEY,
FLEETLLM_VLLM_API_SALT and the optional FLEETLLM_LEGACY_API_KEY, VAST_API_KEY, RUNPOD_API_KEY: the same
builder, so the same checks, the same defaults and the same `Secret`s; its problems name the variable. No
message ever contains a secret value.

Defaults are written once, as the schema's `default`s: the builder reads them (`DEFAULTS`), the
reference docs/configuration.md is generated from them, and the dataclasses below declare none.
"""

from __future__ import annotations

import fnmatch
import ipaddress
import os
import sys
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry

from fleetllm.adapters.notify import Delivery, Notifier
from fleetllm.adapters.oidc import OidcConfig
from fleetllm.adapters.outgoing import link_local_problem
from fleetllm.adapters.state.notifications import NotificationLedger
from fleetllm.adapters.state.store import FetchRetention, is_postgres, sqlite_path
from fleetllm.core.fleet import strictyaml
from fleetllm.core.fleet.bearer import Salt, SaltError
from fleetllm.core.fleet.diagnostics import Diagnostic, pointer
from fleetllm.core.fleet.schema import schema_defaults, validate_document
from fleetllm.core.forge import ForgeConfig
from fleetllm.core.notify import EventKind, Target, TargetKind
from fleetllm.core.secret import Secret
from fleetllm.errors import ConfigurationError
from fleetllm_contract import secretref
from fleetllm_contract.addresses import is_loopback
from fleetllm_contract.logfmt import LEVEL_ENV, LEVELS

SCHEMA = "control-plane"
DEFAULTS: Mapping[str, Any] = schema_defaults(SCHEMA)  # by pointer: the schema's `default`s, the only ones
HOW_TO_REFER = (
    "write it as one reference: ${env:NAME}, ${file:/absolute/path} or ${cred:NAME}, never the value")
_SECRET_POINTERS = ("/repo/webhook_secret", "/secrets", "/state/password", "/admin_tokens", "/operator_tokens",
                    "/viewer_tokens", "/metrics_token", "/auth/oidc/client_secret", "/litellm/master_key",
                    "/providers/vast/api_key", "/providers/runpod/api_key",
                    "/reconcile/pushgateway/username", "/reconcile/pushgateway/password", "/forge/token")
# The secrets only the reconcile job uses (its Pushgateway's credential, the forge's token): `fleetllm serve`
# leaves them unresolved, so its unit or Deployment needs none of them.
RECONCILE_ONLY = ("/reconcile/pushgateway/url", "/reconcile/pushgateway/username", "/reconcile/pushgateway/password",
                  "/forge/token")
_NAMING_RULES = ("schema-unknown-key", "schema-required")  # these quote a key, never a value
TOKEN_LISTS = ("admin_tokens", "operator_tokens", "viewer_tokens")  # the roles' tokens, highest first
_HOW_TO_LIST = ("not a secret reference: write the token as one reference (${env:NAME}, ${file:/absolute/path} "
                "or ${cred:NAME}), or as {name: NAME, token: REFERENCE} where NAME (letters, digits, _.@-) names it "
                "in the audit trail")
# Secrets inside lists of mappings (a pointer pattern, * for an index), with what to say instead.
_SECRET_GLOBS = {
    **{f"/{key}/*": _HOW_TO_LIST for key in TOKEN_LISTS},
    "/notifications/targets/*/url": "not a usable target url: a slack or apprise target's url is a secret "
                                    "reference (${env:NAME}, ${file:/absolute/path} or ${cred:NAME}); a webhook's "
                                    "is an http(s) URL or a secret reference",
    "/notifications/targets/*/bearer": f"not a secret reference: {HOW_TO_REFER}",
    "/notifications/targets/*/header/value": f"not a secret reference: {HOW_TO_REFER}",
    "/reconcile/pushgateway/url": "not a usable pushgateway url: an http(s) URL, or a secret reference "
                                  "(${env:NAME}, ${file:/absolute/path} or ${cred:NAME}) holding one",
}

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
MIN_TOKEN_CHARS = 24  # admin, operator and viewer tokens: refused when shorter
MIN_FLEET_KEY_CHARS = 24  # the fleet key: a warning only (every box template holds it; see fleet_key_warning)
HOW_TO_GENERATE = "python3 -c 'import secrets; print(secrets.token_urlsafe(32))'"


# The environment-only settings (no config file): each variable stands for one key of the file.
ENV_VARIABLES = {
    "/litellm/url": "LITELLM_URL",
    "/litellm/master_key": "LITELLM_MASTER_KEY",
    "/secrets/vllm_api_salt": "FLEETLLM_VLLM_API_SALT",
    "/secrets/legacy_api_key": "FLEETLLM_LEGACY_API_KEY",
    "/providers/vast/api_key": "VAST_API_KEY",
    "/providers/runpod/api_key": "RUNPOD_API_KEY",
}
ENV_REQUIRED = ("LITELLM_URL", "LITELLM_MASTER_KEY", "FLEETLLM_VLLM_API_SALT")
MEMORY_STATE = "sqlite:///:memory:"  # the environment-only settings keep no state between runs

class ApproveTarget(StrEnum):
    BRANCH = "branch"  # a new branch approve/<host> per approval
    TRACKED = "tracked"  # straight onto the tracked branch


# No dataclass below declares a default: the builder gives every field, from the file or the schema.


@dataclass(frozen=True)
class RepoConfig:
    url: str | None  # neither url nor path: no repository configured (the environment-only settings)
    path: Path | None
    branch: str
    subdir: str | None
    refresh_interval_s: float
    clone_dir: Path | None
    webhook_secret: Secret | None
    approve_target: ApproveTarget


@dataclass(frozen=True)
class Secrets:
    vllm_api_salt: Salt
    fleet_key: Secret | None
    legacy_api_key: Secret | None
    previous_vllm_api_salt: Salt | None  # a salt rotation in progress, box by box


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
class ApiToken:
    """One of admin_tokens, operator_tokens or viewer_tokens: the secret, and the name the audit trail
    gives it (None: it is named by its fingerprint)."""

    secret: Secret
    name: str | None


@dataclass(frozen=True)
class TlsConfig:
    cert: Path
    key: Path


@dataclass(frozen=True)
class StateConfig:
    url: str  # sqlite:///PATH or postgresql://user@host:port/dbname (never with a password in it)
    base: Path  # relative sqlite paths are taken from here
    password: Secret | None  # PostgreSQL's, from a reference
    fetch_log_max_rows: int
    fetch_log_max_age_days: float
    reports_per_box: int

    @property
    def retention(self) -> FetchRetention:
        return FetchRetention(self.fetch_log_max_rows, self.fetch_log_max_age_days * 86400.0)


@dataclass(frozen=True)
class LitellmConfig:
    url: str
    master_key: Secret | None
    timeout_s: float
    write_concurrency: int


@dataclass(frozen=True)
class ProviderConfig:
    api_key: Secret
    url: str | None  # None: the provider's public API


@dataclass(frozen=True)
class ProvidersConfig:
    vast: ProviderConfig | None
    runpod: ProviderConfig | None
    static: bool


@dataclass(frozen=True)
class PushgatewayConfig:
    """reconcile.pushgateway: where `reconcile --once` pushes its pass metrics (fleetllm.job.pushmetrics)."""

    url: Secret  # may carry a credential (user:password@, a token in its path): only `where` is shown
    where: str  # scheme://host:port, safe to log
    instance: str
    username: Secret | None
    password: Secret | None
    timeout_s: float


@dataclass(frozen=True)
class ReconcileConfig:
    """reconcile.*: whether passes run and change LiteLLM, and where their metrics go (the reconcile job
    reads the whole settings through fleetllm.job.configfile.JobConfig)."""

    enabled: bool
    dry_run: bool
    pushgateway: PushgatewayConfig | None
    metrics_file: Path | None


@dataclass(frozen=True)
class ServerLimits:
    """What one connection may hold (server.*; reconciler/fleetllm/server/httpserver.py enforces them)."""

    header_timeout_s: float  # the whole header block, from connect or from the previous answer
    body_timeout_s: float  # the whole body, once the headers are in
    max_header_bytes: int
    max_connections: int
    max_connections_per_peer: int  # per IPv4 address or IPv6 /64; trusted proxies exempt
    body_buffer_bytes: int  # bodies over 64 KiB being read at once, in all
    max_connections_per_network: int  # per IPv4 /24 or IPv6 /48; trusted proxies and network_cap_exempt exempt
    network_cap_exempt: tuple[IPNetwork, ...]  # not counted per network (a provider's NAT, many boxes in one /24)


@dataclass(frozen=True)
class NotificationsConfig:
    """notifications.*: where outgoing notifications go and how they are sent (fleetllm.adapters.notify)."""

    targets: tuple[Target, ...]
    renotify_interval_s: float
    send_resolved: bool
    timeout_s: float
    attempts: int
    queue_size: int
    drain_timeout_s: float

    @property
    def delivery(self) -> Delivery:
        return Delivery(self.renotify_interval_s, self.timeout_s, self.attempts, self.queue_size, self.send_resolved)


def make_notifier(settings: NotificationsConfig, ledger: NotificationLedger, *, component: str, instance: str,
                  registry: CollectorRegistry | None = None) -> Notifier:
    """The notifier a process sends with (the control plane, a reconcile job), built from notifications.*."""
    return Notifier(settings.targets, settings.delivery, ledger, component=component, instance=instance,
                    registry=registry)


@dataclass(frozen=True)
class ControlPlaneConfig:
    """The one settings object: what `fleetllm serve`, `plan`, `apply` and `reconcile` run with."""

    source: Path | None  # the config file; None: built from the environment (settings_from_env)
    repo: RepoConfig
    secrets: Secrets
    state: StateConfig
    listen: Listen
    tls: TlsConfig | None
    trusted_proxies: tuple[IPNetwork, ...]
    admin_tokens: tuple[ApiToken, ...]
    operator_tokens: tuple[ApiToken, ...]
    viewer_tokens: tuple[ApiToken, ...]
    metrics_token: Secret | None  # GET /metrics of serve and reconcile --metrics-listen needs it (None: public)
    oidc: OidcConfig | None  # auth.oidc: single sign-on for the status pages (and, if enabled, bearer JWTs)
    attention_max_entries: int
    report_key_required: bool  # server.report_key_required: POST /vllm/report needs the box's report key
    threads: int
    timeout_s: int  # a response a client does not read is dropped after this
    limits: ServerLimits
    gateway_native: Path | None  # server.gateway_native: the directory of the gateway's compiled builds (None: none)
    litellm: LitellmConfig | None
    providers: ProvidersConfig
    reconcile: ReconcileConfig
    notifications: NotificationsConfig
    forge: ForgeConfig | None  # forge.*: commit statuses on the fleet repository (None: not configured)
    log_level: str  # FLEETLLM_LOG_LEVEL, else the file's log_level; `--log-level` overrides it (fleetllm.logs)

    @property
    def where(self) -> str:
        """What to name in a message about the settings as a whole."""
        return str(self.source) if self.source is not None else "the environment"


def _redacted(diagnostic: Diagnostic) -> Diagnostic:
    """Schema messages quote the offending value; under a secret field that could be the secret."""
    where = diagnostic.pointer
    secret = any(where == p or where.startswith(p + "/") for p in _SECRET_POINTERS)
    instead = next((m for glob, m in _SECRET_GLOBS.items() if fnmatch.fnmatchcase(where, glob)), None)
    if not (secret or instead) or diagnostic.rule in _NAMING_RULES:
        return diagnostic
    message = instead or f"not a secret reference: {HOW_TO_REFER}"
    return Diagnostic(diagnostic.file, diagnostic.line, diagnostic.column, diagnostic.pointer, message,
                      diagnostic.rule, diagnostic.severity)


class _Builder:
    """Turns a schema-valid document (a config file, or the environment's stand-in for one) into the
    typed settings, collecting every problem; a key that is not given takes the schema's default."""

    def __init__(self, raw: dict[str, Any], where: Callable[[list[str | int]], str], source: Path | None,
                 base: Path, env: Mapping[str, str] | None, unread: Collection[str] = ()) -> None:
        self.raw = raw
        self.unread = tuple(unread)  # secrets (by pointer) left unresolved: None, or no tokens
        self.where = where
        self.source = source
        self.base = base
        self.env = env
        self.problems: list[str] = []

    def get(self, where: str) -> Any:
        """The value at the JSON pointer `where`; the schema's default (or None) when it is not given."""
        node: Any = self.raw
        for key in where.strip("/").split("/"):
            if isinstance(node, list) and key.isdigit() and int(key) < len(node):
                node = node[int(key)]
            elif isinstance(node, dict) and key in node:
                node = node[key]
            else:
                return DEFAULTS.get(where)
        return node

    def problem(self, path: list[str | int], message: str) -> None:
        self.problems.append(f"{self.where(path)}: {message}")

    def secret(self, path: list[str | int]) -> Secret | None:
        at = pointer(path)
        value = self.get(at)
        if value is None or any(at == u or at.startswith(u + "/") for u in self.unread):
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

    def log_level(self) -> str:
        value = ((os.environ if self.env is None else self.env).get(LEVEL_ENV) or "").strip().lower()
        if value and value not in LEVELS:
            self.problems.append(f"{LEVEL_ENV}: unknown log level {value!r}: use one of {', '.join(LEVELS)}")
        return value or str(self.get("/log_level"))

    def repo(self) -> RepoConfig:
        url, path = self.get("/repo/url"), self.get("/repo/path")
        if "repo" in self.raw and (url is None) == (path is None):
            self.problem(["repo"], "give exactly one of url (a remote to clone) or path (a local repository)")
        target = ApproveTarget(self.get("/repo/approve/target"))
        if target is ApproveTarget.TRACKED and url is not None:
            self.problem(["repo", "approve", "target"], "approve.target: tracked needs a local path repository; "
                         "with a url the control plane cannot push, so approvals go on new branches")
        return RepoConfig(url=url, path=self.path(path), branch=self.get("/repo/branch"),
                          subdir=self.get("/repo/subdir"),
                          refresh_interval_s=float(self.get("/repo/refresh_interval_s")),
                          clone_dir=self.path(self.get("/repo/clone_dir")),
                          webhook_secret=self.secret(["repo", "webhook_secret"]), approve_target=target)

    def secrets(self) -> Secrets | None:
        salt_secret = self.secret(["secrets", "vllm_api_salt"])
        fleet_key = self.secret(["secrets", "fleet_key"])
        legacy = self.secret(["secrets", "legacy_api_key"])
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
                       self.previous_salt())

    def previous_salt(self) -> Salt | None:
        secret = self.secret(["secrets", "previous_vllm_api_salt"])
        if secret is None:
            return None
        try:
            return Salt(secret.reveal())
        except SaltError as exc:
            self.problem(["secrets", "previous_vllm_api_salt"], f"{secret.reference}: {exc}")
            return None

    def tokens(self, key: str) -> tuple[ApiToken, ...]:
        """One token list: each item a reference, or {name, token} (the schema allows nothing else)."""
        tokens: list[ApiToken] = []
        for i, item in enumerate(self.get(f"/{key}") or ()):
            named = isinstance(item, dict)
            token = self.secret([key, i, "token"] if named else [key, i])
            if token is None:
                continue
            if len(token.reveal()) < MIN_TOKEN_CHARS:
                self.problem([key, i], f"{key}[{i}] ({token.reference}) is {len(token.reveal())} characters; "
                             f"{key} need at least {MIN_TOKEN_CHARS}: generate one with {HOW_TO_GENERATE}")
            tokens.append(ApiToken(token, item["name"] if named else None))
        return tuple(tokens)

    def all_tokens(self) -> dict[str, tuple[ApiToken, ...]]:
        lists = {key: self.tokens(key) for key in TOKEN_LISTS}
        names = [t.name for tokens in lists.values() for t in tokens if t.name is not None]
        for name in sorted({n for n in names if names.count(n) > 1}):
            self.problem([TOKEN_LISTS[0]], f"two tokens are named {name!r}: give each its own name, so the audit "
                         "trail tells them apart")
        return lists

    def metrics_token(self) -> Secret | None:
        token = self.secret(["metrics_token"])
        if token is not None and len(token.reveal()) < MIN_TOKEN_CHARS:
            self.problem(["metrics_token"], f"metrics_token ({token.reference}) is {len(token.reveal())} characters; "
                         f"it needs at least {MIN_TOKEN_CHARS}: generate one with {HOW_TO_GENERATE}")
        return token

    def oidc(self) -> OidcConfig | None:
        if self.get("/auth/oidc") is None:
            return None
        at: list[str | int] = ["auth", "oidc"]
        secret = self.secret([*at, "client_secret"])
        urls = {}
        for key in ("issuer", "redirect_base"):
            text = str(self.get(f"/auth/oidc/{key}"))
            try:
                parts = urlsplit(text)
                host = parts.hostname or ""
                _ = parts.port  # a bad port raises here
            except ValueError:
                host = ""
            if not host:
                self.problem([*at, key], f"{text!r} is not an http(s) URL with a host")
            elif parts.scheme != "https" and not is_loopback(host):
                self.problem([*at, key], f"{key} must be https ({text} is plain http to {host}): sessions and "
                             "codes would cross the network in clear text (http is for loopback only)")
            if key == "redirect_base" and host and parts.path.strip("/"):
                self.problem([*at, key], f"{text!r} has a path: give scheme://host[:port] only (the control plane "
                             "serves /oidc/callback and /login at its root)")
            urls[key] = text
        if secret is None:
            return None
        scopes = tuple(self.get("/auth/oidc/scopes"))
        if "openid" not in scopes:
            scopes = ("openid", *scopes)
        return OidcConfig(issuer=urls["issuer"], client_id=str(self.get("/auth/oidc/client_id")),
                          client_secret=secret, redirect_base=urls["redirect_base"].rstrip("/"), scopes=scopes,
                          groups_claim=tuple(str(self.get("/auth/oidc/groups_claim")).split(".")),
                          roles=dict(self.get("/auth/oidc/roles")),
                          accept_bearer_jwts=bool(self.get("/auth/oidc/accept_bearer_jwts")),
                          leeway_s=int(self.get("/auth/oidc/leeway_s")),
                          timeout_s=float(self.get("/auth/oidc/timeout_s")))

    def networks(self) -> tuple[IPNetwork, ...]:
        networks: list[IPNetwork] = []
        for i, text in enumerate(self.get("/trusted_proxies") or ()):
            try:
                networks.append(ipaddress.ip_network(text, strict=False))
            except ValueError:
                self.problem(["trusted_proxies", i], f"{text!r} is not an address range such as 10.0.0.0/8 or ::1")
        return tuple(networks)

    def limits(self) -> ServerLimits:
        per_peer, per_network = self.get("/server/max_connections_per_peer"), \
            self.get("/server/max_connections_per_network")
        if per_network < per_peer:
            self.problem(["server", "max_connections_per_network"], f"{per_network} is below "
                         f"server.max_connections_per_peer ({per_peer}): one address could not open the connections "
                         "it may hold; raise it to at least that, or lower max_connections_per_peer")
        exempt: list[IPNetwork] = []
        for i, text in enumerate(self.get("/server/network_cap_exempt")):
            at: list[str | int] = ["server", "network_cap_exempt", i]
            try:
                network = ipaddress.ip_network(text)
            except ValueError:
                try:
                    loose = ipaddress.ip_network(text, strict=False)
                except ValueError:
                    self.problem(at, f"{text!r} is not a network such as 203.0.113.0/24 or 2001:db8:5::/48")
                else:
                    self.problem(at, f"{text!r} has host bits set: write the network {loose} (or "
                                 f"{text.split('/', 1)[0]}/{loose.max_prefixlen} "
                                 "for that one address)")
                continue
            exempt.append(network)
        return ServerLimits(
            float(self.get("/server/header_timeout_s")), float(self.get("/server/body_timeout_s")),
            self.get("/server/max_header_bytes"), self.get("/server/max_connections"), per_peer,
            self.get("/server/body_buffer_bytes"), per_network, tuple(exempt))

    def gateway_native(self) -> Path | None:
        """server.gateway_native, where the gateway's compiled builds are (fleetllm.server.nativebuilds serves
        them): a directory named is checked here, so that a mistyped path stops the start and is not taken
        for a control plane without builds; when none is named, default_gateway_native()."""
        path = self.path(self.get("/server/gateway_native"))
        if path is None:
            return default_gateway_native()
        if not path.is_dir():
            self.problem(["server", "gateway_native"], f"{path}: not a directory: name the directory that holds "
                         "the gateway's compiled builds (one subdirectory each, made by "
                         "tools/build_gateway_native.py), or remove the key to serve the image's own, if any")
        return path

    def state(self) -> StateConfig:
        url = self.get("/state/url") or MEMORY_STATE  # only the environment-only settings have none
        password = self.secret(["state", "password"])
        if is_postgres(url):
            try:
                has_password = bool(urlsplit(url).password)
            except ValueError:
                has_password = False  # PostgreSQL will say what is wrong with it, without the URL
            if has_password:
                self.problem(["state", "url"], "the URL carries a password: take it out and give it as "
                             "state.password: ${cred:NAME} (or ${env:NAME}, ${file:/path})")
        elif password is not None:
            self.problem(["state", "password"], "a password is only for a postgresql:// state url")
        return StateConfig(url, self.base, password, self.get("/state/fetch_log_max_rows"),
                           float(self.get("/state/fetch_log_max_age_days")), self.get("/state/reports_per_box"))

    def listen(self) -> Listen:
        try:
            return Listen.parse(self.get("/listen"))
        except ValueError as exc:
            self.problem(["listen"], str(exc))
            return Listen.parse(DEFAULTS["/listen"])

    def tls(self) -> TlsConfig | None:
        if "tls" not in self.raw:
            return None
        cert, key = self.path(self.get("/tls/cert")), self.path(self.get("/tls/key"))
        assert cert is not None
        assert key is not None
        for name, file in (("cert", cert), ("key", key)):
            if not file.is_file():
                self.problem(["tls", name], f"{file}: no such file")
        return TlsConfig(cert, key)

    def litellm(self) -> LitellmConfig | None:
        if "litellm" not in self.raw:
            return None
        return LitellmConfig(self.get("/litellm/url"), self.secret(["litellm", "master_key"]),
                             float(self.get("/litellm/timeout_s")), self.get("/litellm/write_concurrency"))

    def providers(self) -> ProvidersConfig:
        def one(name: str) -> ProviderConfig | None:
            if self.get(f"/providers/{name}") is None:
                return None
            key = self.secret(["providers", name, "api_key"])
            return ProviderConfig(key, self.get(f"/providers/{name}/url")) if key is not None else None

        return ProvidersConfig(vast=one("vast"), runpod=one("runpod"), static=self.get("/providers/static") is not None)

    def notifications(self) -> NotificationsConfig:
        targets = []
        for i, raw in enumerate(self.get("/notifications/targets") or ()):
            target = self.target(i, raw)
            if target is not None:
                targets.append(target)
        names = [t.name for t in targets]
        for name in sorted({n for n in names if names.count(n) > 1}):
            self.problem(["notifications", "targets"], f"two targets are named {name!r}: give each its own name")
        return NotificationsConfig(
            tuple(targets), float(self.get("/notifications/renotify_interval_s")),
            self.get("/notifications/send_resolved"), float(self.get("/notifications/timeout_s")),
            self.get("/notifications/attempts"), self.get("/notifications/queue_size"),
            float(self.get("/notifications/drain_timeout_s")))

    def target(self, i: int, raw: dict[str, Any]) -> Target | None:
        at: list[str | int] = ["notifications", "targets", i]
        kind = TargetKind(raw["kind"])
        plain = not raw["url"].startswith("${")  # the schema let through a reference or an http(s) URL
        url = Secret(raw["url"], f"the url of target {raw['name']!r}") if plain else self.secret([*at, "url"])
        bearer = self.secret([*at, "bearer"])
        header_value = self.secret([*at, "header", "value"])
        if kind is not TargetKind.WEBHOOK and (bearer is not None or header_value is not None):
            self.problem(at, f"target {raw['name']!r}: bearer and header are for webhook targets; a {kind} "
                         "target's url is its only credential")
        if url is None:
            return None
        events = frozenset(EventKind(e) for e in raw["events"])
        if kind is TargetKind.APPRISE:
            from fleetllm.adapters.notify import apprise_problem

            if (problem := apprise_problem(url.reveal())) is not None:
                self.problem([*at, "url"], f"target {raw['name']!r}: {url.reference} holds {problem}")
                return None
            return Target(raw["name"], kind, url, events)
        try:
            parts = urlsplit(url.reveal())
            usable = parts.scheme in ("http", "https") and bool(parts.hostname)
        except ValueError:
            usable = False
        if not usable:
            self.problem([*at, "url"], f"{url.reference} does not hold an http(s) URL")
            return None
        if (problem := link_local_problem(parts.hostname or "")) is not None:
            self.problem([*at, "url"], f"target {raw['name']!r}: {problem}")
            return None
        carries_secret = kind is TargetKind.SLACK or bearer is not None or header_value is not None or not plain
        if parts.scheme == "http" and carries_secret and not is_loopback(parts.hostname or ""):
            self.problem([*at, "url"], f"target {raw['name']!r} would send a secret in clear text over http to "
                         f"{parts.hostname}: use https (plain http is for loopback receivers only)")
        header = (raw["header"]["name"], header_value) if header_value is not None else None
        return Target(raw["name"], kind, url, events, bearer, header)

    def pushgateway(self) -> PushgatewayConfig | None:
        if self.get("/reconcile/pushgateway") is None:
            return None
        at: list[str | int] = ["reconcile", "pushgateway"]
        raw = str(self.get("/reconcile/pushgateway/url"))
        plain = not raw.startswith("${")  # the schema let through a reference or an http(s) URL
        url = Secret(raw, "reconcile.pushgateway.url") if plain else self.secret([*at, "url"])
        username, password = self.secret([*at, "username"]), self.secret([*at, "password"])
        if (username is None) != (password is None):
            self.problem(at, "give both username and password (HTTP basic auth), or neither")
        if url is None:
            return None
        try:
            parts = urlsplit(url.reveal())
            usable = parts.scheme in ("http", "https") and bool(parts.hostname)
            where = f"{parts.scheme}://{parts.hostname}" + (f":{parts.port}" if parts.port else "")
        except ValueError:
            usable, where = False, ""
        if not usable:
            self.problem([*at, "url"], f"{url.reference} does not hold an http(s) URL")
            return None
        if plain and (parts.username or parts.password):
            self.problem([*at, "url"], "the URL carries a credential (user:password@): give it as "
                         "url: ${cred:NAME} (or ${env:NAME}, ${file:/path}), or use username and password")
        if parts.username is not None and username is not None:
            self.problem(at, "the url carries user:password@ and username/password are given too: keep one")
        carries_secret = not plain or username is not None
        if parts.scheme == "http" and carries_secret and not is_loopback(parts.hostname or ""):
            self.problem([*at, "url"], f"the pushgateway url would send a credential in clear text over http to "
                         f"{parts.hostname}: use https (plain http is for loopback or an unauthenticated "
                         "in-cluster Pushgateway without a credential)")
        return PushgatewayConfig(url, where, str(self.get("/reconcile/pushgateway/instance")), username, password,
                                 float(self.get("/reconcile/pushgateway/timeout_s")))

    def http_url(self, at: list[str | int], text: str, carries: str | None) -> str | None:
        """An http(s) URL with a host and no credential in it, without its trailing slash; when it `carries`
        a secret (what would go with it), plain http only to a loopback host."""
        key = str(at[-1])
        try:
            parts = urlsplit(text)
            host = parts.hostname or ""
            parts.port  # noqa: B018 (a port that is not a number raises here)
        except ValueError:
            self.problem(at, f"{text!r} is not an http(s) URL with a host")
            return None
        if parts.scheme not in ("http", "https") or not host:
            self.problem(at, f"{text!r} is not an http(s) URL with a host")
            return None
        if parts.username is not None or parts.password is not None:
            self.problem(at, f"{key} carries a credential (user:password@): take it out")
            return None
        if parts.query or parts.fragment:
            self.problem(at, f"{key} has a query or a fragment: give scheme://host[:port][/path] only")
            return None
        if carries is not None and parts.scheme == "http" and not is_loopback(host):
            self.problem(at, f"{key} must be https ({text} is plain http to {host}): {carries} would cross the "
                         "network in clear text (http is for loopback only)")
            return None
        return text.rstrip("/")

    def forge(self) -> ForgeConfig | None:
        if self.get("/forge") is None:
            return None
        at: list[str | int] = ["forge"]
        token = self.secret([*at, "token"])
        if token is not None and not token.reveal().strip():
            self.problem([*at, "token"], f"{token.reference} is empty: give a token that may write commit statuses")
        api_url = self.http_url([*at, "api_url"], str(self.get("/forge/api_url")), "the forge's token")
        link = self.get("/forge/control_plane_url")
        control_plane_url = self.http_url([*at, "control_plane_url"], str(link), None) if link else None  # a link
        if api_url is None:
            return None
        return ForgeConfig(kind=str(self.get("/forge/kind")), api_url=api_url,
                           repository=str(self.get("/forge/repository")), token=token,
                           context=str(self.get("/forge/context")), control_plane_url=control_plane_url,
                           timeout_s=float(self.get("/forge/timeout_s")), attempts=int(self.get("/forge/attempts")),
                           drain_timeout_s=float(self.get("/forge/drain_timeout_s")))

    def build(self) -> ControlPlaneConfig | None:
        repo = self.repo()
        secrets = self.secrets()
        tokens = self.all_tokens()
        config = ControlPlaneConfig(
            source=self.source, repo=repo, secrets=secrets,  # type: ignore[arg-type]  # checked below
            state=self.state(), listen=self.listen(), tls=self.tls(), trusted_proxies=self.networks(),
            admin_tokens=tokens["admin_tokens"], operator_tokens=tokens["operator_tokens"],
            viewer_tokens=tokens["viewer_tokens"], metrics_token=self.metrics_token(), oidc=self.oidc(),
            attention_max_entries=self.get("/attention/max_entries"),
            report_key_required=self.get("/server/report_key_required"), threads=self.get("/server/threads"),
            timeout_s=self.get("/server/timeout_s"), limits=self.limits(), gateway_native=self.gateway_native(),
            litellm=self.litellm(), providers=self.providers(),
            reconcile=ReconcileConfig(self.get("/reconcile/enabled"), self.get("/reconcile/dry_run"),
                                      self.pushgateway(), self.path(self.get("/reconcile/metrics_file"))),
            notifications=self.notifications(), forge=self.forge(),
            log_level=self.log_level())
        return None if self.problems or secrets is None else config


def fleet_key_warning(config: ControlPlaneConfig) -> str | None:
    """A short fleet key is a warning, never a refusal: it is baked into every box's provisioning
    template, so refusing it would cut off every box at the next restart of the control plane."""
    key = config.secrets.fleet_key
    if key is None or len(key.reveal()) >= MIN_FLEET_KEY_CHARS:
        return None
    return (f"warning: secrets.fleet_key ({key.reference}) is {len(key.reveal())} characters, shorter than "
            f"{MIN_FLEET_KEY_CHARS}: anyone who guesses it gets every box's config and bearers. It keeps working; "
            "rotate it (docs/runbooks.md, \"Rotate the fleet key\")")


def metrics_token_warning(config: ControlPlaneConfig, listen: Listen) -> str | None:
    """No metrics_token: /metrics stays public (as before the setting), with this warning, unless `listen`
    is a loopback address (the demo, a machine's local Prometheus): nobody else reaches it then."""
    if config.metrics_token is not None or listen.is_loopback:
        return None
    return ("warning: no metrics_token: GET /metrics is public, and it names every box, pod and whether the salt is "
            f"weak; set metrics_token: ${{cred:NAME}} (generate one with {HOW_TO_GENERATE}) and give Prometheus "
            "the same token (docs/security.md, \"Metrics\")")


def load_config(path: str | os.PathLike[str], env: Mapping[str, str] | None = None, *,
                unread: Collection[str] = ()) -> ControlPlaneConfig:
    """Read, validate and resolve the config file. Raises ConfigurationError with every problem found.
    `unread`: pointers of secrets this process never uses (the reconciler's fleetllm.job.configfile.SERVE_ONLY),
    left unresolved, so its service needs no credential for them."""
    display = os.fspath(path)
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigurationError(f"{display}: cannot read the config file: {exc.strerror}") from None
    doc = strictyaml.load(data, display)
    problems = [f"{display}:{p.mark.line}:{p.mark.column}: {p.message} [{p.rule}]" for p in doc.problems]
    if doc.root is None or doc.empty:
        raise ConfigurationError(
            "\n".join(problems or [f"{display}: the config file is empty; it needs repo, secrets and state"]))
    diagnostics, _ = validate_document(doc, SCHEMA)
    problems.extend(_redacted(d).text() for d in sorted(diagnostics))
    if problems:
        raise ConfigurationError("\n".join(problems))

    def where(at: list[str | int]) -> str:
        mark = doc.mark_at(at)
        return f"{doc.path}:{mark.line}:{mark.column}: {pointer(at)}"

    raw: dict[str, Any] = doc.value  # type: ignore[assignment]  # a schema-checked mapping
    return _built(_Builder(raw, where, Path(display), Path(display).resolve().parent, env, unread))


def settings_from_env(env: Mapping[str, str]) -> ControlPlaneConfig:
    """The settings of a job without a config file: each of ENV_VARIABLES stands for its key (a secret as
    the reference ${env:NAME}); no repository (--repo or the current directory) and no state store (the
    probe history starts from LiteLLM each run). Raises ConfigurationError naming the variables."""
    missing = [name for name in ENV_REQUIRED if not env.get(name)]
    if missing:
        raise ConfigurationError("no config file given or found (--config, $FLEETLLM_CONFIG, ./fleetllm.yaml, "
                                 "~/.config/fleetllm/config.yaml, /etc/fleetllm/config.yaml) and " + ", ".join(missing)
                                 + " not set: pass --config FILE, or set LITELLM_URL, LITELLM_MASTER_KEY and "
                                 "FLEETLLM_VLLM_API_SALT")
    if not env["LITELLM_URL"].startswith(("http://", "https://")):
        raise ConfigurationError("LITELLM_URL must be the proxy's http(s) URL, e.g. http://127.0.0.1:4000")
    raw: dict[str, Any] = {}
    for where, name in ENV_VARIABLES.items():
        if env.get(name):  # an empty optional variable is an unset one
            *parents, key = where.strip("/").split("/")
            node = raw
            for parent in parents:
                node = node.setdefault(parent, {})
            node[key] = env[name] if where == "/litellm/url" else f"${{env:{name}}}"

    def named(at: list[str | int]) -> str:
        return ENV_VARIABLES.get(pointer(at), f"the environment ({pointer(at)})")

    return _built(_Builder(raw, named, None, Path.cwd(), env))


def _built(builder: _Builder) -> ControlPlaneConfig:
    config = builder.build()
    if config is None:
        raise ConfigurationError("\n".join(builder.problems))
    return config


def default_gateway_native() -> Path | None:
    """Where the gateway's compiled builds are when server.gateway_native is not set:
    <sys.prefix>/share/fleetllm/gateway-native when that directory exists (the image puts its builds there,
    beside the installed fleetllm), else None: no builds, every box runs the gateway's Python modules."""
    found = Path(sys.prefix) / "share" / "fleetllm" / "gateway-native"
    return found if found.is_dir() else None


def default_clone_dir(config: ControlPlaneConfig, name: str = "fleet-repo.git") -> Path:
    """Where a remote repository is cloned when repo.clone_dir is not set: beside the SQLite state file (or
    the config file when the store is in memory or PostgreSQL)."""
    db = None if is_postgres(config.state.url) else sqlite_path(config.state.url, config.state.base)
    beside = config.source.resolve().parent if config.source is not None else Path.cwd()
    return (db.parent if db is not None else beside) / name
