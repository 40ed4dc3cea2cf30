"""The reconciler's settings: from the control-plane config file (`llmfleet serve --config`, read by
`llmfleet.settings`), or from the environment for a CI job without one. One config for both.

What the reconciler uses of the control-plane config:

    repo: {path: /srv/fleet, branch: main}   (or url: ..., fetched into a clone of the reconciler's own)
    secrets: {vllm_api_salt: ${env:...}, legacy_api_key: ${env:...}}
    state: {url: sqlite:///var/lib/llmfleet/state.sqlite3}   (or postgresql://..., password: ${cred:...})
    litellm: {url, master_key, timeout_s: 30, write_concurrency: 4}
    providers: {vast: {api_key, url}, runpod: {api_key, url}, static: {}}
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from llmfleet.adapters.providers import RUNPOD_URL, VAST_URL, ProviderAccess
from llmfleet.core.fleet.bearer import Salt, SaltError
from llmfleet.core.fleet.model import Provider
from llmfleet.settings import ConfigError as ControlPlaneConfigError
from llmfleet.settings import ControlPlaneConfig, RepoConfig, default_clone_dir
from llmfleet.settings import load_config as control_plane_config

RECONCILER_CLONE = "fleet-repo-reconcile.git"  # not the control plane's clone: two processes, two fetches


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
    remote_repo: RepoConfig | None = None  # repo.url: fetched into `clone_dir` before each pass
    clone_dir: Path | None = None
    state_url: str | None = None
    state_password: str | None = field(default=None, repr=False)
    dry_run: bool = False  # reconcile.dry_run: plan and report, never write to LiteLLM
    previous_salt: Salt | None = None  # secrets.previous_vllm_api_salt: a rotation in progress, box by box


def config_from_env(env: Mapping[str, str]) -> ReconcileConfig:
    """LITELLM_URL, LITELLM_MASTER_KEY, LLMFLEET_VLLM_API_SALT, optional LLMFLEET_LEGACY_API_KEY,
    VAST_API_KEY, RUNPOD_API_KEY. No state store: the probe history starts from LiteLLM each run."""
    missing = [n for n in ("LITELLM_URL", "LITELLM_MASTER_KEY", "LLMFLEET_VLLM_API_SALT") if not env.get(n)]
    if missing:
        raise ConfigError("no --config given and " + ", ".join(missing) + " not set: pass --config FILE, or set "
                          "LITELLM_URL, LITELLM_MASTER_KEY and LLMFLEET_VLLM_API_SALT")
    url = env["LITELLM_URL"]
    if not url.startswith(("http://", "https://")):
        raise ConfigError("LITELLM_URL must be the proxy's http(s) URL, e.g. http://127.0.0.1:4000")
    try:
        salt = Salt(env["LLMFLEET_VLLM_API_SALT"])
    except SaltError as exc:
        raise ConfigError(f"LLMFLEET_VLLM_API_SALT: {exc}") from None
    providers = {provider: ProviderAccess(env[var], default)
                 for provider, var, default in ((Provider.VAST, "VAST_API_KEY", VAST_URL),
                                                (Provider.RUNPOD, "RUNPOD_API_KEY", RUNPOD_URL)) if env.get(var)}
    return ReconcileConfig(url, env["LITELLM_MASTER_KEY"], salt, env.get("LLMFLEET_LEGACY_API_KEY") or None,
                           providers=providers)


def from_control_plane(config: ControlPlaneConfig) -> ReconcileConfig:
    if config.litellm is None or config.litellm.master_key is None:
        raise ConfigError(f"{config.source}: the reconciler needs a litellm section with url and master_key")
    providers: dict[Provider, ProviderAccess] = {}
    for provider, block, default_url in ((Provider.VAST, config.providers.vast, VAST_URL),
                                         (Provider.RUNPOD, config.providers.runpod, RUNPOD_URL)):
        if block is not None:
            providers[provider] = ProviderAccess(block.api_key.reveal(), block.url or default_url)
    repo = config.repo
    remote = repo.path is None
    clone_dir = None
    if remote:
        clone_dir = default_clone_dir(config, RECONCILER_CLONE)
        if repo.clone_dir is not None:  # beside the control plane's: /x/fleet.git -> /x/fleet-reconcile.git
            clone_dir = repo.clone_dir.with_name(repo.clone_dir.name.removesuffix(".git") + "-reconcile.git")
    legacy = config.secrets.legacy_api_key
    return ReconcileConfig(
        litellm_url=config.litellm.url, litellm_master_key=config.litellm.master_key.reveal(),
        salt=config.secrets.vllm_api_salt, legacy_key=legacy.reveal() if legacy is not None else None,
        litellm_timeout_s=config.litellm.timeout_s, write_concurrency=config.litellm.write_concurrency,
        providers=providers,
        repo_path=None if repo.path is None else str(repo.path / repo.subdir if repo.subdir else repo.path),
        branch=repo.branch, remote_repo=repo if remote else None, clone_dir=clone_dir,
        state_url=_absolute_sqlite(config.state.url, config.state.base),
        state_password=config.state.password.reveal() if config.state.password is not None else None,
        dry_run=config.reconcile.dry_run, previous_salt=config.secrets.previous_vllm_api_salt)


def _absolute_sqlite(url: str, base: Path) -> str:
    if url.startswith("sqlite:///") and url != "sqlite:///:memory:":
        path = Path(url[len("sqlite:///"):])
        return "sqlite:///" + str(path if path.is_absolute() else (base / path).resolve())
    return url


def load_config(path: str | Path, env: Mapping[str, str] | None = None) -> ReconcileConfig:
    try:
        return from_control_plane(control_plane_config(path, env))
    except ControlPlaneConfigError as exc:
        raise ConfigError("\n".join(exc.problems)) from None
