"""What the reconciler reads of the one settings object (fleetllm.settings): a view with no value and no
default of its own. `load_config(path)` reads the control-plane config file (`fleetllm serve --config`);
`config_from_env(env)` the environment of a CI job without one; both through fleetllm.settings' one
builder, so both run the same checks and keep every secret a `Secret` until a client's constructor.

What the reconciler uses of the control-plane config:

    repo: {path: /srv/fleet, branch: main}   (or url: ..., fetched into a clone of the reconciler's own)
    secrets: {vllm_api_salt: ${env:...}, legacy_api_key: ${env:...}}
    state: {url: sqlite:///var/lib/fleetllm/state.sqlite3}   (or postgresql://..., password: ${cred:...})
    litellm: {url, master_key, timeout_s, write_concurrency}
    providers: {vast: {api_key, url}, runpod: {api_key, url}, static: {}}
    reconcile: {enabled, dry_run, pushgateway: {url, instance, username, password, timeout_s}, metrics_file}
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from fleetllm.adapters.providers import RUNPOD_URL, VAST_URL, ProviderAccess
from fleetllm.core.fleet.bearer import Salt
from fleetllm.core.fleet.model import Provider
from fleetllm.core.secret import Secret
from fleetllm.settings import (
    DEFAULTS,
    MEMORY_STATE,
    ControlPlaneConfig,
    LitellmConfig,
    PushgatewayConfig,
    RepoConfig,
    default_clone_dir,
    settings_from_env,
)
from fleetllm.settings import load_config as load_settings

RECONCILER_CLONE = "fleet-repo-reconcile.git"  # not the control plane's clone: two processes, two fetches
# The secrets only `fleetllm serve` uses (boxes' fleet key, the push webhook, page and API tokens, the single
# sign-on client's secret): the reconciler leaves them unresolved, so its unit or Job is given none of them
# (deploy/systemd, deploy/kubernetes).
SERVE_ONLY = ("/repo/webhook_secret", "/secrets/fleet_key", "/admin_tokens", "/operator_tokens", "/viewer_tokens",
              "/auth/oidc/client_secret")


@dataclass(frozen=True)
class JobConfig:
    """The settings as the reconcile job reads them (the whole ControlPlaneConfig, not only its
    `reconcile:` section, fleetllm.settings.ReconcileConfig). `litellm` and `master_key` are the settings'
    own, checked to be there (`of`); every other attribute is read from `settings` when asked."""

    settings: ControlPlaneConfig
    litellm: LitellmConfig | None  # None: no litellm section (or no master key): `plan` shows verdicts only

    @classmethod
    def of(cls, settings: ControlPlaneConfig) -> JobConfig:
        """Without a litellm section (url and master_key) the settings still serve `fleetllm plan`, which
        judges every server and says it cannot show LiteLLM; `apply` and `reconcile` refuse."""
        usable = settings.litellm is not None and settings.litellm.master_key is not None
        return cls(settings, settings.litellm if usable else None)

    @property
    def litellm_url(self) -> str | None:
        return self.litellm.url if self.litellm is not None else None

    @property
    def litellm_master_key(self) -> Secret | None:
        return self.litellm.master_key if self.litellm is not None else None

    @property
    def litellm_timeout_s(self) -> float:
        return self.litellm.timeout_s if self.litellm is not None else float(DEFAULTS["/litellm/timeout_s"])

    @property
    def write_concurrency(self) -> int:
        return self.litellm.write_concurrency if self.litellm is not None else int(
            DEFAULTS["/litellm/write_concurrency"])

    @property
    def enabled(self) -> bool:
        """reconcile.enabled: false, and `apply` / `reconcile` refuse to run passes."""
        return self.settings.reconcile.enabled

    @property
    def source(self) -> str:
        """Where these settings came from, for messages."""
        return self.settings.where

    @property
    def salt(self) -> Salt:
        return self.settings.secrets.vllm_api_salt

    @property
    def legacy_key(self) -> Secret | None:
        return self.settings.secrets.legacy_api_key

    @property
    def previous_salt(self) -> Salt | None:
        """secrets.previous_vllm_api_salt: a salt rotation in progress, box by box."""
        return self.settings.secrets.previous_vllm_api_salt

    @property
    def providers(self) -> Mapping[Provider, ProviderAccess]:
        providers: dict[Provider, ProviderAccess] = {}
        blocks = self.settings.providers
        for provider, block, default_url in ((Provider.VAST, blocks.vast, VAST_URL),
                                             (Provider.RUNPOD, blocks.runpod, RUNPOD_URL)):
            if block is not None:
                providers[provider] = ProviderAccess(block.api_key, block.url or default_url)
        return providers

    @property
    def _configured_repo(self) -> bool:
        return self.settings.repo.path is not None or self.settings.repo.url is not None

    @property
    def repo_path(self) -> str | None:
        repo = self.settings.repo
        return None if repo.path is None else str(repo.path / repo.subdir if repo.subdir else repo.path)

    @property
    def branch(self) -> str | None:  # None: no repository configured, so --repo's working tree
        return self.settings.repo.branch if self._configured_repo else None

    @property
    def remote_repo(self) -> RepoConfig | None:  # repo.url: fetched into `clone_dir` before each pass
        return self.settings.repo if self.settings.repo.url is not None else None

    @property
    def clone_dir(self) -> Path | None:
        repo = self.settings.repo
        if repo.url is None:
            return None
        if repo.clone_dir is not None:  # beside the control plane's: /x/fleet.git -> /x/fleet-reconcile.git
            return repo.clone_dir.with_name(repo.clone_dir.name.removesuffix(".git") + "-reconcile.git")
        return default_clone_dir(self.settings, RECONCILER_CLONE)

    @property
    def state_url(self) -> str | None:  # None: an in-memory store
        state = self.settings.state
        if state.url == MEMORY_STATE:
            return None
        if state.url.startswith("sqlite:///"):
            path = Path(state.url[len("sqlite:///"):])
            return "sqlite:///" + str(path if path.is_absolute() else (state.base / path).resolve())
        return state.url

    @property
    def state_password(self) -> Secret | None:
        return self.settings.state.password

    @property
    def dry_run(self) -> bool:  # reconcile.dry_run: plan and report, never write to LiteLLM
        return self.settings.reconcile.dry_run

    @property
    def pushgateway(self) -> PushgatewayConfig | None:  # reconcile.pushgateway: where `reconcile --once` pushes
        return self.settings.reconcile.pushgateway

    @property
    def metrics_file(self) -> Path | None:  # reconcile.metrics_file: node_exporter's textfile (--metrics-file)
        return self.settings.reconcile.metrics_file


def config_from_env(env: Mapping[str, str]) -> JobConfig:
    """LITELLM_URL, LITELLM_MASTER_KEY, FLEETLLM_VLLM_API_SALT, optional FLEETLLM_LEGACY_API_KEY,
    VAST_API_KEY, RUNPOD_API_KEY (fleetllm.settings.settings_from_env)."""
    return JobConfig.of(settings_from_env(env))


def load_config(path: str | Path, env: Mapping[str, str] | None = None) -> JobConfig:
    return JobConfig.of(load_settings(path, env, unread=SERVE_ONLY))
