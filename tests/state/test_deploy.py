"""deploy/: the manifests parse (kubeconform's schemas cannot be fetched offline, so the fields that
matter are checked here), both configs load with fleetllm's own reader, every ${cred:NAME} they use is
provided (by a LoadCredential= line, by a key of the Secret), and systemd-analyze verifies the units."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetllm.errors import ConfigurationError
from fleetllm.job.configfile import SERVE_ONLY
from fleetllm.job.configfile import load_config as reconcile_config
from fleetllm.settings import load_config
from tests.conftest import ROOT

DEPLOY = ROOT / "deploy"
KUBE = DEPLOY / "kubernetes"
SYSTEMD = DEPLOY / "systemd"
CRED = re.compile(r"\$\{cred:([^}]+)\}")


def cred_names(config_text: str, *, skip: tuple[str, ...] = ()) -> set[str]:
    """The ${cred:NAME} names the config's values use (comments aside), but those under the pointers `skip`."""
    def walk(node: Any, at: str) -> Iterator[str]:
        if any(at == s or at.startswith(s + "/") for s in skip):
            return
        if isinstance(node, dict):
            for key, value in node.items():
                yield from walk(value, f"{at}/{key}")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                yield from walk(value, f"{at}/{i}")
        elif isinstance(node, str):
            yield from CRED.findall(node)

    return set(walk(yaml.safe_load(config_text), ""))


def manifests() -> dict[str, dict[str, Any]]:
    """kind -> the document (each kind appears once)."""
    found: dict[str, dict[str, Any]] = {}
    for path in sorted(KUBE.glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if document:
                assert document["kind"] not in found, f"{path}: a second {document['kind']}"
                found[document["kind"]] = document
    return found


def credentials_dir(tmp_path: Path, names: set[str]) -> Path:
    directory = tmp_path / "credentials"
    directory.parent.mkdir(parents=True, exist_ok=True)
    directory.mkdir()
    for name in names:
        (directory / name).write_text(f"value-of-{name}-0123456789abcdef\n")
    return directory


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((KUBE / "kustomization.yaml").read_text())
    on_disk = {p.name for p in KUBE.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == on_disk


def test_kubernetes_manifests(tmp_path: Path) -> None:
    found = manifests()
    assert set(found) >= {"Deployment", "CronJob", "Secret", "Service", "Ingress", "ConfigMap", "PodDisruptionBudget"}
    pod = found["Deployment"]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert found["Deployment"]["spec"]["replicas"] >= 2
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health/live"  # public: /metrics needs its token
    assert {"name": "CREDENTIALS_DIRECTORY", "value": "/run/credentials/fleetllm"} in container["env"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    selector = found["Deployment"]["spec"]["selector"]["matchLabels"]
    assert found["Service"]["spec"]["selector"] == selector
    assert found["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"] == selector
    ingress = found["Ingress"]["spec"]
    assert ingress["tls"][0]["hosts"] == [ingress["rules"][0]["host"]]
    assert ingress["rules"][0]["http"]["paths"][0]["backend"]["service"]["name"] == found["Service"]["metadata"]["name"]

    cron = found["CronJob"]["spec"]
    assert cron["concurrencyPolicy"] == "Forbid"
    job = cron["jobTemplate"]["spec"]["template"]["spec"]
    assert job["containers"][0]["args"][:2] == ["reconcile", "--once"]
    assert "--repo" not in job["containers"][0]["args"]  # it fetches repo.url itself

    config_text = found["ConfigMap"]["data"]["control-plane.yaml"]
    secret_keys = set(found["Secret"]["stringData"])
    assert cred_names(config_text) == secret_keys  # every reference provided, nothing extra
    mounted = {v["name"]: v for v in pod["volumes"]}
    assert mounted["credentials"]["secret"]["secretName"] == found["Secret"]["metadata"]["name"]

    config_path = tmp_path / "control-plane.yaml"
    config_path.write_text(config_text)
    config = load_config(config_path, {"CREDENTIALS_DIRECTORY": str(credentials_dir(tmp_path, secret_keys))})
    assert config.state.url.startswith("postgresql://")
    assert config.state.password is not None
    assert config.state.password.reveal() == "value-of-pg-password-0123456789abcdef"
    assert config.metrics_token is not None  # /metrics is for Prometheus' bearer only
    # the Job mounts only the keys a pass uses, and its config loads with exactly those
    job_volumes = {v["name"]: v for v in job["volumes"]}
    items = job_volumes["credentials"]["secret"]["items"]
    mounted_keys = {item["key"] for item in items}
    assert all(item["path"] == item["key"] for item in items)
    assert mounted_keys == cred_names(config_text, skip=SERVE_ONLY) < secret_keys
    assert {"fleet-key", "webhook-secret", "admin-token"}.isdisjoint(mounted_keys)
    job_credentials = credentials_dir(tmp_path / "job", mounted_keys)
    reconcile = reconcile_config(config_path, {"CREDENTIALS_DIRECTORY": str(job_credentials)})
    assert reconcile.state_password is not None and reconcile.litellm_master_key is not None
    assert reconcile.settings.secrets.fleet_key is None and reconcile.settings.admin_tokens == ()
    with pytest.raises(ConfigurationError, match="fleet-key"):  # while `serve` needs every one
        load_config(config_path, {"CREDENTIALS_DIRECTORY": str(job_credentials)})
    # the reconciler's clone goes beside repo.clone_dir, on a writable volume of the Job's container
    clone_dir = reconcile.clone_dir
    assert clone_dir is not None
    writable = {m["mountPath"] for m in job["containers"][0]["volumeMounts"] if not m.get("readOnly")}
    assert str(clone_dir.parent) in writable


def systemd_config(tmp_path: Path) -> tuple[str, Path]:
    """The systemd config, its TLS files pointed at throwaway ones (the reader checks they exist)."""
    text = (SYSTEMD / "control-plane.yaml").read_text()
    for name in ("fullchain.pem", "privkey.pem"):
        (tmp_path / name).write_text("placeholder\n")
        text = text.replace(f"/etc/fleetllm/tls/{name}", str(tmp_path / name))
    path = tmp_path / "control-plane.yaml"
    path.write_text(text)
    return text, path


def loaded_credentials(unit: str) -> set[str]:
    return set(re.findall(r"^LoadCredential=([^:]+):", (SYSTEMD / unit).read_text(), re.MULTILINE))


def test_systemd_units_load_the_credentials_their_service_uses(tmp_path: Path) -> None:
    text, path = systemd_config(tmp_path)
    names = cred_names(text)
    assert loaded_credentials("fleetllm-serve.service") == names  # serve resolves every reference at start
    # the reconcile pass only those it uses: none of the fleet key, webhook secret and admin token
    needed = cred_names(text, skip=SERVE_ONLY)
    assert loaded_credentials("fleetllm-reconcile.service") == needed
    assert {"fleet-key", "webhook-secret", "admin-token"} == names - needed
    config = load_config(path, {"CREDENTIALS_DIRECTORY": str(credentials_dir(tmp_path, names))})
    assert config.repo.clone_dir == Path("/var/lib/fleetllm/fleet-repo.git")
    reconcile = (SYSTEMD / "fleetllm-reconcile.service").read_text()
    assert "--repo" not in reconcile  # it fetches repo.url itself, into its own clone in its StateDirectory
    only_needed = credentials_dir(tmp_path / "reconcile", needed)
    clone_dir = reconcile_config(path, {"CREDENTIALS_DIRECTORY": str(only_needed)}).clone_dir
    assert clone_dir == Path("/var/lib/fleetllm/fleet-repo-reconcile.git")
    assert "StateDirectory=fleetllm" in reconcile


def test_the_serve_unit_waits_for_readiness() -> None:
    """Type=notify: `fleetllm serve` sends READY=1 once it listens (tests/server/test_sdnotify.py)."""
    serve = (SYSTEMD / "fleetllm-serve.service").read_text()
    service = serve[serve.index("[Service]"):]
    assert re.findall(r"^Type=(\S+)$", service, re.MULTILINE) == ["notify"]
    assert re.findall(r"^NotifyAccess=(\S+)$", service, re.MULTILINE) in ([], ["main"])
def test_an_invalid_head_is_no_failed_pass_for_the_shipped_schedulers() -> None:
    """`reconcile --once` exits 3 when it ran on the last valid commit (issue 14.7): the systemd unit
    counts 3 as success; a Kubernetes Job counts only 0, so the CronJob asks for 0."""
    from fleetllm.cli.passes import EXIT_INVALID_HEAD

    reconcile = (SYSTEMD / "fleetllm-reconcile.service").read_text()
    assert re.search(rf"^SuccessExitStatus={EXIT_INVALID_HEAD}$", reconcile, re.MULTILINE)
    cronjob = next(d for d in yaml.safe_load_all((KUBE / "reconciler.yaml").read_text())
                   if d and d["kind"] == "CronJob")
    args = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--invalid-head-exit") + 1] == "0"


@pytest.mark.integration  # .ci/run's machine has systemd-analyze: this must run there
@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_analyze_verify(tmp_path: Path) -> None:
    fleetllm = shutil.which("fleetllm") or str(Path(__file__).resolve().parents[2] / ".venv" / "bin" / "fleetllm")
    units = []
    for unit in sorted(SYSTEMD.glob("fleetllm-*")):  # ExecStart must exist: point it at this checkout's
        target = tmp_path / unit.name
        target.write_text(unit.read_text().replace("/opt/fleetllm/bin/fleetllm", fleetllm))
        units.append(str(target))
    done = subprocess.run(["systemd-analyze", "verify", "--man=no", *units], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == "", done.stderr  # unknown keys are only warnings: none allowed
