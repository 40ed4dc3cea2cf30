"""The keys of the control-plane config file (`llmfleet serve --config`) that the reconciler needs.

A stop-gap reader kept in this one module until `reconciler.config` (the control plane's loader) lands;
then `load_config` becomes a thin adapter over it. Secrets must be `${env:}`/`${file:}`/`${cred:}`
references (installer.secretref); a literal secret is refused so it never sits in a config file.

    litellm: {url, master_key, timeout_s: 30, write_concurrency: 8}
    providers: {vast: {api_key, url}, runpod: {api_key, url}, static: {}}
    secrets: {vllm_api_salt: ${env:LLMFLEET_VLLM_API_SALT},
              legacy_api_key: ${env:LLMFLEET_LEGACY_API_KEY}}   # optional; also accepted at the top level
    repo: {path: /srv/fleet, branch: main}              # or a plain path
    state: {url: sqlite:///var/lib/llmfleet/state.db}
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from installer import secretref
from reconciler.fleet.bearer import Salt, SaltError
from reconciler.fleet.model import Provider
from reconciler.reconcile.observe.providers import RUNPOD_URL, VAST_URL, ProviderAccess


class ConfigError(Exception):
    pass


@dataclass(frozen=True)
class ReconcileConfig:
    litellm_url: str
    litellm_master_key: str = field(repr=False)
    salt: Salt
    legacy_key: str | None = field(default=None, repr=False)
    litellm_timeout_s: float = 30.0
    write_concurrency: int = 8
    providers: Mapping[Provider, ProviderAccess] = field(default_factory=dict, repr=False)
    repo_path: str | None = None
    branch: str | None = None
    state_url: str | None = None


def _secret(doc: Mapping[str, Any], key: str, where: str, env: Mapping[str, str] | None,
            required: bool = True) -> str | None:
    value = doc.get(key)
    if value is None or value == "":
        if required:
            raise ConfigError(f"{where}.{key} is missing: give a ${{env:NAME}}, ${{file:/path}} or ${{cred:NAME}} "
                              "reference")
        return None
    if not isinstance(value, str):
        raise ConfigError(f"{where}.{key} must be a string reference such as ${{env:NAME}}")
    if not secretref.references(value):
        raise ConfigError(f"{where}.{key} holds a literal value: secrets must be references "
                          "(${env:NAME}, ${file:/path}, ${cred:NAME}), never written in the file")
    try:
        return secretref.expand(value, env)
    except secretref.SecretRefError as exc:
        raise ConfigError(f"{where}.{key}: {exc}") from None


def _mapping(doc: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    value = doc.get(key) or {}
    if not isinstance(value, dict):
        raise ConfigError(f"{where}{key} must be a mapping")
    return value


def _number(doc: Mapping[str, Any], key: str, where: str, default: float, minimum: float) -> float:
    value = doc.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < minimum:
        raise ConfigError(f"{where}.{key} must be a number >= {minimum:g}")
    return float(value)


def parse_config(doc: Any, env: Mapping[str, str] | None = None, base: Path | None = None) -> ReconcileConfig:
    if not isinstance(doc, dict):
        raise ConfigError("the config file must be a YAML mapping")
    litellm = _mapping(doc, "litellm", "")
    url = litellm.get("url")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise ConfigError("litellm.url must be the proxy's http(s) URL, e.g. http://127.0.0.1:4000")
    master_key = _secret(litellm, "master_key", "litellm", env)
    assert master_key is not None
    secrets = _mapping(doc, "secrets", "") if "secrets" in doc else doc
    where = "secrets" if "secrets" in doc else "config"
    salt_value = _secret(secrets, "vllm_api_salt", where, env)
    assert salt_value is not None
    try:
        salt = Salt(salt_value)
    except SaltError as exc:
        raise ConfigError(f"vllm_api_salt: {exc}") from None
    providers: dict[Provider, ProviderAccess] = {}
    for name, block in _mapping(doc, "providers", "").items():
        if name not in {p.value for p in Provider}:
            raise ConfigError(f"providers.{name}: unknown provider (vast, runpod, static)")
        if name == Provider.STATIC.value:
            continue
        if not isinstance(block, dict):
            raise ConfigError(f"providers.{name} must be a mapping with api_key and url")
        key = _secret(block, "api_key", f"providers.{name}", env)
        assert key is not None
        default_url = VAST_URL if name == Provider.VAST.value else RUNPOD_URL
        providers[Provider(name)] = ProviderAccess(key, str(block.get("url") or default_url),
                                                   _number(block, "timeout_s", f"providers.{name}", 30, 0.1))
    repo = doc.get("repo")
    repo_path = repo.get("path") or repo.get("url") if isinstance(repo, dict) else repo
    branch = repo.get("branch") if isinstance(repo, dict) else None
    if repo_path is not None and base is not None and "://" not in str(repo_path):
        repo_path = str((base / str(repo_path)).resolve()) if not Path(str(repo_path)).is_absolute() else repo_path
    state = doc.get("state")
    state_url = state.get("url") if isinstance(state, dict) else state
    if isinstance(state_url, str) and state_url.startswith("sqlite:///") and base is not None:
        path = Path(state_url[len("sqlite:///"):])
        state_url = "sqlite:///" + str(path if path.is_absolute() else (base / path).resolve())
    return ReconcileConfig(
        litellm_url=url, litellm_master_key=master_key, salt=salt,
        legacy_key=_secret(secrets, "legacy_api_key", where, env, required=False),
        litellm_timeout_s=_number(litellm, "timeout_s", "litellm", 30, 0.1),
        write_concurrency=int(_number(litellm, "write_concurrency", "litellm", 8, 1)),
        providers=providers, repo_path=str(repo_path) if repo_path else None,
        branch=str(branch) if branch else None, state_url=str(state_url) if state_url else None)


ENV_CONFIG: dict[str, Any] = {  # without --config: the same settings from the environment (a CI job's secrets)
    "litellm": {"url": "${env:LITELLM_URL}", "master_key": "${env:LITELLM_MASTER_KEY}"},
    "vllm_api_salt": "${env:LLMFLEET_VLLM_API_SALT}",
}


def config_from_env(env: Mapping[str, str]) -> ReconcileConfig:
    """LITELLM_URL, LITELLM_MASTER_KEY, LLMFLEET_VLLM_API_SALT, optional LLMFLEET_LEGACY_API_KEY,
    VAST_API_KEY, RUNPOD_API_KEY. No state store: the probe history starts from LiteLLM each run."""
    missing = [n for n in ("LITELLM_URL", "LITELLM_MASTER_KEY", "LLMFLEET_VLLM_API_SALT") if not env.get(n)]
    if missing:
        raise ConfigError("no --config given and " + ", ".join(missing) + " not set: pass --config FILE, or set "
                          "LITELLM_URL, LITELLM_MASTER_KEY and LLMFLEET_VLLM_API_SALT")
    doc: dict[str, Any] = {**ENV_CONFIG, "litellm": {**ENV_CONFIG["litellm"], "url": env["LITELLM_URL"]}}
    if env.get("LLMFLEET_LEGACY_API_KEY"):
        doc["legacy_api_key"] = "${env:LLMFLEET_LEGACY_API_KEY}"
    providers = {name: {"api_key": f"${{env:{var}}}"}
                 for name, var in (("vast", "VAST_API_KEY"), ("runpod", "RUNPOD_API_KEY")) if env.get(var)}
    if providers:
        doc["providers"] = providers
    return parse_config(doc, env)


def load_config(path: str | Path, env: Mapping[str, str] | None = None) -> ReconcileConfig:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the config file: {exc.strerror}") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    try:
        return parse_config(doc, env, Path(path).resolve().parent)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
