"""The demo's scratch directory: its layout, the secrets generated for the run, the fleet git
repository and the control plane's config.

    <scratch>/fleet/                    the fleet repository (git, branch main)
    <scratch>/secrets/                  0700; one file per secret, 0600, never on a command line
    <scratch>/control-plane/            control-plane.yaml, state.sqlite3, serve.log, reconcile.log
    <scratch>/simulated-boxes/<addr>/   one simulated GPU box each (see boxes.py)
    <scratch>/litellm/                  the LiteLLM proxy and its PostgreSQL, when the demo builds one
    <scratch>/run/                      the boxes' Supervisor sockets (in /tmp when <scratch> is too long)

Its path must be safe inside Supervisor files (fleetllm_installer.settings.SAFE_PATH): no spaces.
"""

from __future__ import annotations

import os
import secrets
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from fleetllm.adapters.git import commit_worktree_files, identity, run_git
from fleetllm.demo.fleet import DemoError
from fleetllm.errors import SourceError
from fleetllm_installer.settings import SAFE_PATH

SECRET_NAMES = ("fleet-key", "vllm-api-salt", "legacy-api-key", "admin-token", "litellm-master-key")
GIT_IDENTITY = identity("fleetllm demo", "demo@fleetllm.invalid")
SOCKET_PATH_MAX = 100  # sun_path is 108 bytes on Linux


@dataclass(frozen=True)
class Workspace:
    root: Path
    sockets: Path  # the boxes' Supervisor sockets: <scratch>/run, or a short dir in /tmp for a long <scratch>

    @property
    def tag(self) -> str:
        """What every process of this run carries in its environment (procs.TAG): the scratch directory."""
        return str(self.root)

    @property
    def fleet(self) -> Path:
        return self.root / "fleet"

    @property
    def secrets(self) -> Path:
        return self.root / "secrets"

    @property
    def control_plane(self) -> Path:
        return self.root / "control-plane"

    @property
    def config(self) -> Path:
        return self.control_plane / "control-plane.yaml"

    @property
    def state_file(self) -> Path:
        return self.control_plane / "state.sqlite3"

    @property
    def state_url(self) -> str:
        return f"sqlite:///{self.state_file}"

    @property
    def boxes(self) -> Path:
        return self.root / "simulated-boxes"

    @property
    def litellm(self) -> Path:
        return self.root / "litellm"

    def secret_file(self, name: str) -> Path:
        return self.secrets / name

    def secret(self, name: str) -> str:
        return self.secret_file(name).read_text(encoding="utf-8")

    def write_secret(self, name: str, value: str) -> Path:
        path = self.secret_file(name)
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(value)
        return path

    @property
    def git_env(self) -> dict[str, str]:
        """git's environment in the demo: none of the user's configuration, the demo's identity."""
        return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.root), **GIT_IDENTITY}

    def git(self, *args: str) -> str:
        try:
            return run_git(*args, cwd=self.fleet, base_env=self.git_env).strip()
        except SourceError as exc:
            raise DemoError(f"{exc} (in {self.fleet})") from None


def create(root: Path | None) -> Workspace:
    """The scratch directory: `root` (made if missing), or a new one in the temp directory."""
    if root is None:
        temp = tempfile.gettempdir()
        root = Path(tempfile.mkdtemp(prefix="fleetllm-demo-", dir=temp if SAFE_PATH.match(temp) else "/tmp"))  # noqa: S108
    root = root.resolve()
    if not SAFE_PATH.match(str(root)):
        raise DemoError(f"{root}: the scratch directory's path may hold only letters, digits and _./+:@- (it is "
                        "written into Supervisor files); pass --workdir /tmp/fleetllm-demo")
    if root.exists() and any(root.iterdir()):
        raise DemoError(f"{root} is not empty: give a new or empty directory to --workdir")
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)  # PostgreSQL, run as user postgres, must reach <scratch>/litellm
    sockets = root / "run"
    if len(str(sockets / "255.255.255.255.sock")) > SOCKET_PATH_MAX:
        sockets = Path(tempfile.mkdtemp(prefix="fleetllm-demo-run-", dir="/tmp"))
    workspace = Workspace(root, sockets)
    workspace.secrets.mkdir(mode=0o700)
    for folder in (workspace.control_plane, workspace.boxes, workspace.fleet, workspace.sockets):
        folder.mkdir(exist_ok=True)
    tokens = {"fleet-key": "fleet-demo-", "vllm-api-salt": "", "legacy-api-key": "sk-legacy-demo-",
              "admin-token": "admin-demo-", "litellm-master-key": "sk-demo-"}
    for name, prefix in tokens.items():
        workspace.write_secret(name, prefix + secrets.token_urlsafe(24))
    workspace.write_secret("admin-auth.header", f"Authorization: Bearer {workspace.secret('admin-token')}\n")
    (root / "README.txt").write_text(
        "fleetllm demo scratch directory: a simulated fleet (no GPU here; every vLLM is the stub).\n"
        "Removed when the demo stops, unless it was started with --keep or --workdir.\n")
    return workspace


def init_fleet_repo(workspace: Workspace, files: Mapping[str, bytes]) -> str:
    """The fleet repository with the files in one commit on main; returns the commit."""
    workspace.git("init", "-q", "-b", "main")
    for name, content in files.items():
        (workspace.fleet / name).write_bytes(content)
    workspace.git("add", "-A")
    workspace.git("commit", "-q", "-m", "Demo fleet: fleet-repo-example on simulated loopback boxes")
    return workspace.git("rev-parse", "HEAD")


def commit_file(workspace: Workspace, name: str, content: str, message: str) -> str:
    return commit_files(workspace, {name: content}, message)


def commit_files(workspace: Workspace, files: Mapping[str, str], message: str) -> str:
    """One commit of every file given (a pull request's change, merged); returns it."""
    try:
        return commit_worktree_files(workspace.fleet, files, message, base_env=workspace.git_env)
    except SourceError as exc:
        raise DemoError(f"{exc} (in {workspace.fleet})") from None


@dataclass(frozen=True)
class DemoForge:
    """A forge the demo's rollouts set commit statuses on (`fleetllm demo --forge-api-url ...`)."""

    api_url: str
    repository: str  # OWNER/NAME
    token_file: Path  # read by the reconciler through a ${file:} reference, never copied


def forge_section(forge: DemoForge | None, port: int) -> str:
    if forge is None:
        return "# forge: none given, so no commit status is set (fleetllm demo --forge-api-url ...)\n"
    return (f"forge:\n  api_url: {forge.api_url}\n  repository: {forge.repository}\n"
            f"  token: ${{file:{forge.token_file.resolve()}}}\n  control_plane_url: http://127.0.0.1:{port}\n")


def control_plane_config(workspace: Workspace, port: int, litellm_url: str | None,
                         forge: DemoForge | None = None, runpod_url: str | None = None) -> Path:
    """The control plane's config: every secret a ${file:} reference into <scratch>/secrets (the forge's
    token: a reference to the file given). `runpod_url`: the simulated RunPod (rentals.py), its API key the
    secret runpod-api-key."""
    def ref(name: str) -> str:
        return "${file:" + str(workspace.secret_file(name)) + "}"

    litellm = (f"litellm:\n  url: {litellm_url}\n  master_key: {ref('litellm-master-key')}\n"
               if litellm_url else "# litellm: none given, so the boxes route and the rollouts run without it\n")
    runpod = (f"  runpod:  # the simulated RunPod of the rent-box scenario\n    api_key: {ref('runpod-api-key')}\n"
              f"    url: {runpod_url}\n" if runpod_url else "")
    workspace.config.write_text(f"""\
# The control plane of `fleetllm demo` (a simulated fleet). Secrets are files in {workspace.secrets}.
repo:
  path: {workspace.fleet}
  branch: main
  refresh_interval_s: 1
secrets:
  fleet_key: {ref('fleet-key')}
  vllm_api_salt: {ref('vllm-api-salt')}
  legacy_api_key: {ref('legacy-api-key')}
listen: 127.0.0.1:{port}
state:
  url: {workspace.state_url}
admin_tokens: ["{ref('admin-token')}"]
{litellm}providers:
  static: {{}}
{runpod}{forge_section(forge, port)}""", encoding="utf-8")
    return workspace.config
