"""deploy/kubernetes/ and the Helm chart stay in step: the chart rendered with its defaults (release name
fleetllm, the plain Ingress's settings given as values) is the plain manifests, object by object and field
by field, but for what a chart adds on purpose (the app.kubernetes.io/instance label in selectors and its
other labels, the config checksum annotation, imagePullPolicy) and for the credentials, which the chart
mounts from a projected volume (the same files from the same Secret keys). The plain manifests themselves
validate against the Kubernetes API schemas (kubernetes-validate, strict), as the chart's output does."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.deploy.chart import config_text, mounted_credentials, one, pod_specs, render
from tests.deploy.test_helm_chart import KUBE_VERSIONS
from tests.state.test_deploy import KUBE

CHART_ONLY_LABELS = {"app.kubernetes.io/instance", "app.kubernetes.io/version", "app.kubernetes.io/managed-by",
                     "helm.sh/chart"}
BOTH = ("Deployment", "CronJob", "Service", "PodDisruptionBudget", "Ingress")


def plain() -> list[dict[str, Any]]:
    return [d for path in sorted(KUBE.glob("*.yaml")) if path.name != "kustomization.yaml"
            for d in yaml.safe_load_all(path.read_text()) if d]


def chart(tmp_path: Path) -> list[dict[str, Any]]:
    """The chart with its defaults, and the plain Ingress's settings as values."""
    ingress = one(plain(), "Ingress")
    (tls,) = ingress["spec"]["tls"]
    values = tmp_path / "plain-ingress-values.yaml"
    values.write_text(yaml.safe_dump({"ingress": {
        "enabled": True, "className": ingress["spec"]["ingressClassName"],
        "annotations": ingress["metadata"]["annotations"], "host": ingress["spec"]["rules"][0]["host"],
        "tlsSecretName": tls["secretName"]}}))
    return render((values,))


def secret_keys() -> dict[str, list[str]]:
    return {d["metadata"]["name"]: list(d["stringData"]) for d in plain() if d["kind"] == "Secret"}


def normal(node: Any, pod: dict[str, Any] | None = None) -> Any:
    """`node` without what only the chart adds, its credentials volumes as {file: (Secret, key)}."""
    if isinstance(node, list):
        return [normal(item, pod) for item in node]
    if not isinstance(node, dict):
        return node
    if "containers" in node:  # a pod spec: its credentials volumes are read through its containers
        pod = node
    out = {}
    for key, value in node.items():
        if key in {"matchLabels", "labels", "selector"} and isinstance(value, dict) and all(
                isinstance(v, str) for v in value.values()):
            value = {k: v for k, v in value.items() if k not in CHART_ONLY_LABELS}
        elif key == "annotations":
            value = {k: v for k, v in value.items() if k != "checksum/config"}
            if not value:
                continue
        elif key == "imagePullPolicy" and value == "IfNotPresent":  # what the API server sets for a tagged image
            continue
        elif key == "volumes" and pod is not None:
            value = [credentials(volume, pod) if volume["name"] == "credentials" else volume for volume in value]
        out[key] = normal(value, pod)
    return out


def credentials(volume: dict[str, Any], pod: dict[str, Any]) -> dict[str, Any]:
    (container,) = [c for c in pod["containers"]
                    if any(m["name"] == volume["name"] for m in c["volumeMounts"])]
    mode = (volume.get("secret") or volume.get("projected") or {}).get("defaultMode")
    return {"name": volume["name"], "defaultMode": mode,
            "files": mounted_credentials(pod, container, whole=secret_keys())}


@pytest.mark.parametrize("kind", BOTH)
def test_the_chart_renders_the_plain_manifest(kind: str, tmp_path: Path) -> None:
    mine, theirs = one(chart(tmp_path), kind), one(plain(), kind)
    assert mine["apiVersion"] == theirs["apiVersion"]
    assert mine["metadata"]["name"] == theirs["metadata"]["name"]
    assert theirs["metadata"].get("labels", {}).items() <= mine["metadata"]["labels"].items()
    assert normal(mine["spec"]) == normal(theirs["spec"])


def test_the_same_config(tmp_path: Path) -> None:
    mine, theirs = chart(tmp_path), plain()
    assert one(mine, "ConfigMap", "fleetllm-config")["metadata"]["name"] == one(theirs, "ConfigMap")["metadata"]["name"]
    assert yaml.safe_load(config_text(mine)) == yaml.safe_load(config_text(theirs))


def test_the_same_credentials_from_the_same_secret(tmp_path: Path) -> None:
    """The chart's default credentials are the keys of deploy/kubernetes/secret.yaml, so one Secret serves
    both; each pod mounts the same files from it."""
    mine, theirs = chart(tmp_path), plain()
    for (where, pod), (_, plain_pod) in zip(pod_specs(mine), pod_specs(theirs), strict=True):
        for container, plain_container in zip(pod["containers"], plain_pod["containers"], strict=True):
            assert mounted_credentials(pod, container) == mounted_credentials(
                plain_pod, plain_container, whole=secret_keys()), where
    (secret,) = [d for d in theirs if d["kind"] == "Secret"]
    control_plane = one(mine, "Deployment")["spec"]["template"]["spec"]
    files = mounted_credentials(control_plane, control_plane["containers"][0])
    assert set(files.values()) == {(secret["metadata"]["name"], key) for key in secret["stringData"]}


def test_only_the_namespace_and_the_secret_are_the_plain_manifests_own(tmp_path: Path) -> None:
    """The chart creates neither: helm install --namespace (--create-namespace), and the Secret is yours."""
    kinds = {d["kind"] for d in plain()} - {d["kind"] for d in chart(tmp_path)}
    assert kinds == {"Namespace", "Secret"}


def test_the_comparison_sees_a_difference(tmp_path: Path) -> None:
    """A field changed on either side fails the comparison: it is not vacuous."""
    mine, theirs = one(chart(tmp_path), "Deployment"), one(plain(), "Deployment")
    for path in (("replicas",), ("template", "spec", "containers", 0, "args", -1),
                 ("template", "spec", "securityContext", "runAsUser"),
                 ("template", "spec", "containers", 0, "readinessProbe", "httpGet", "path")):
        changed = copy.deepcopy(mine)
        node = changed["spec"]
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = "changed"
        assert normal(changed["spec"]) != normal(theirs["spec"]), path
    changed = copy.deepcopy(mine)
    projected = next(v for v in changed["spec"]["template"]["spec"]["volumes"] if v["name"] == "credentials")
    projected["projected"]["sources"][0]["secret"]["items"].pop()
    assert normal(changed["spec"]) != normal(theirs["spec"])


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_the_plain_manifests_validate(kube_version: str) -> None:
    failures = []
    for document in plain():
        try:
            kubernetes_validate.validate(document, kube_version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            failures.append(f"{document['kind']}/{document['metadata']['name']}: "
                            f"{'.'.join(map(str, exc.path))}: {exc.message}")
    assert failures == []
