"""deploy/helm/fleetllm: the chart lints and renders with the real helm (its defaults and every values file
of its ci/ folder), every rendered object validates against the Kubernetes API schemas (kubernetes-validate,
strict: an unknown field fails), the rendered config loads with fleetllm's own reader from exactly the
credentials each pod mounts, no option of values.yaml is ignored, and no secret value can enter it."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from fleetllm.errors import ConfigurationError
from fleetllm.job.configfile import SERVE_ONLY
from fleetllm.job.configfile import load_config as reconcile_config
from fleetllm.settings import load_config
from fleetllm_contract import version
from tests.deploy.chart import (
    CHART,
    CI_VALUES,
    CRD_KINDS,
    RELEASE,
    SCENARIOS,
    config_text,
    mounted_credentials,
    one,
    pod_specs,
    render,
    run_helm,
    template_error,
    template_text,
)
from tests.state.test_deploy import cred_names, credentials_dir

# The oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest kubernetes-validate knows.
KUBE_VERSIONS = ("1.25.0", kubernetes_validate.utils.latest_version())
VERSION = version.__version__
SCHEMA = json.loads((CHART / "values.schema.json").read_text())
DEFAULTS = yaml.safe_load((CHART / "values.yaml").read_text())


def scenario_ids() -> list[str]:
    return list(SCENARIOS)


# --- the chart itself -----------------------------------------------------------------------------------

def test_the_chart_is_fleetllms_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2" and chart["name"] == "fleetllm"
    assert chart["version"] == VERSION  # a string in YAML as 1.0.0 is not a number
    assert chart["appVersion"] == VERSION
    assert DEFAULTS["image"] == {"repository": "ghcr.io/fleetllm/fleetllm", "tag": "", "pullPolicy": "IfNotPresent"}


def test_values_schema_is_a_schema_and_holds_for_every_values_file() -> None:
    jsonschema.Draft7Validator.check_schema(SCHEMA)  # helm 3 and 4 both read draft-07
    validator = jsonschema.Draft7Validator(SCHEMA)
    assert list(validator.iter_errors(DEFAULTS)) == []
    for path in sorted(CI_VALUES.glob("*-values.yaml")):
        merged = merge(DEFAULTS, yaml.safe_load(path.read_text()))
        assert [e.message for e in validator.iter_errors(merged)] == [], path.name


@pytest.mark.parametrize(("path", "value"), [
    ("secrets.fleetKey", "s3cr3t-sentinel"),  # a value instead of a reference
    ("state.postgresql.password", "s3cr3t-sentinel"),
    ("adminTokens", ["s3cr3t-sentinel"]),
    ("secrets.vllmApiSalt", {"key": "vllm-api-salt", "value": "s3cr3t-sentinel"}),
    ("secrets.vllmApiSalt", {"key": ""}),  # the salt is required
    ("controlPlane.replicaz", 3),  # a typo
])
def test_values_schema_refuses(path: str, value: Any) -> None:
    values = copy.deepcopy(DEFAULTS)
    *parents, last = path.split(".")
    node = values
    for key in parents:
        node = node[key]
    node[last] = value
    assert list(jsonschema.Draft7Validator(SCHEMA).iter_errors(values)), path


@pytest.mark.parametrize("scenario", scenario_ids())
def test_helm_lint(scenario: str) -> None:
    done = run_helm("lint", "--strict", str(CHART), *[a for p in SCENARIOS[scenario] for a in ("--values", str(p))])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in done.stdout
    assert "[WARNING]" not in done.stdout and "[ERROR]" not in done.stdout, done.stdout


EXPECTED = {
    "defaults": {("ConfigMap", "fleetllm-config"), ("Deployment", "fleetllm-control-plane"),
                 ("PodDisruptionBudget", "fleetllm-control-plane"), ("Service", "fleetllm"),
                 ("CronJob", "fleetllm-reconcile")},
    "everything": {("ConfigMap", "fleet-eu-config"), ("Deployment", "fleet-eu-control-plane"),
                   ("PodDisruptionBudget", "fleet-eu-control-plane"), ("Service", "fleet-eu"),
                   ("CronJob", "fleet-eu-reconcile"), ("Ingress", "fleet-eu"), ("ServiceMonitor", "fleet-eu"),
                   ("PrometheusRule", "fleet-eu"), ("ConfigMap", "fleet-eu-dashboard")},
    "loop": {("ConfigMap", "fleetllm-config"), ("Deployment", "fleetllm-control-plane"),
             ("Service", "fleetllm"), ("Deployment", "fleetllm-reconcile"), ("Service", "fleetllm-reconcile"),
             ("ServiceMonitor", "fleetllm")},
    "sqlite": {("ConfigMap", "fleetllm-config"), ("Deployment", "fleetllm-control-plane"),
               ("PersistentVolumeClaim", "fleetllm-state"), ("Service", "fleetllm"), ("ServiceMonitor", "fleetllm")},
    "no-reconciler": {("ConfigMap", "fleetllm-config"), ("Deployment", "fleetllm-control-plane"),
                      ("Service", "fleetllm")},
}


def test_every_values_file_is_a_scenario_here() -> None:
    assert set(SCENARIOS) == set(EXPECTED)


@pytest.mark.parametrize("scenario", scenario_ids())
def test_renders_what_the_scenario_asks_for(scenario: str) -> None:
    documents = render(SCENARIOS[scenario])
    assert {(d["kind"], d["metadata"]["name"]) for d in documents} == EXPECTED[scenario]
    assert "Secret" not in {d["kind"] for d in documents}  # secrets by reference only
    for document in documents:
        labels = document["metadata"]["labels"]
        assert labels["app.kubernetes.io/managed-by"] == "Helm" and labels["app.kubernetes.io/version"] == VERSION


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
@pytest.mark.parametrize("scenario", scenario_ids())
def test_every_rendered_manifest_validates(scenario: str, kube_version: str) -> None:
    failures = []
    for document in render(SCENARIOS[scenario]):
        where = f"{document['kind']}/{document['metadata']['name']}"
        try:
            kubernetes_validate.validate(document, kube_version, strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            assert document["kind"] in CRD_KINDS, f"{where}: no schema for it in Kubernetes {kube_version}"
        except kubernetes_validate.ValidationError as exc:
            failures.append(f"{where}: {'.'.join(map(str, exc.path))}: {exc.message}")
    assert failures == []


def test_the_validator_catches_a_misspelt_field() -> None:
    """The strict schemas refuse what the API server would drop or refuse: the check above can fail."""
    deployment = copy.deepcopy(one(render(), "Deployment"))
    deployment["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBE_VERSIONS[-1], strict=True)
    deployment = copy.deepcopy(one(render(), "Deployment"))
    deployment["spec"]["replicas"] = "2"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBE_VERSIONS[-1], strict=True)


def test_the_install_notes_name_the_secret_keys_to_create() -> None:
    done = run_helm("install", RELEASE, str(CHART), "--dry-run=client", "--namespace", "fleetllm",
                    "--values", str(SCENARIOS["everything"][0]))
    assert done.returncode == 0, done.stderr
    notes = done.stdout[done.stdout.index("NOTES:"):]
    assert "fleet-eu-boxes/boxes-key -> ${cred:fleet-key}" in notes
    assert "fleet-eu-slack/url -> ${cred:slack-webhook-url}" in notes
    assert "3 control-plane replica(s) on postgresql, the reconciler as a cronjob" in notes


# --- the config and the credentials ---------------------------------------------------------------------

def writable_config(text: str, tmp_path: Path) -> Path:
    """The rendered config, its TLS files pointed at throwaway ones (the reader checks they exist)."""
    for name in ("tls.crt", "tls.key"):
        (tmp_path / name).write_text("placeholder\n")
        text = text.replace(f"/etc/fleetllm-tls/{name}", str(tmp_path / name))
    path = tmp_path / "control-plane.yaml"
    path.write_text(text)
    return path


def credentials(tmp_path: Path, names: set[str]) -> Path:
    """A credentials directory with a value for each name (a URL for a name that ends in -url)."""
    directory = credentials_dir(tmp_path, names)
    for name in names:
        if name.endswith("-url"):
            (directory / name).write_text(f"https://hooks.example.com/{name}/0123456789abcdef\n")
    return directory


@pytest.mark.parametrize("scenario", scenario_ids())
def test_each_pod_mounts_exactly_the_credentials_its_process_reads(scenario: str, tmp_path: Path) -> None:
    documents = render(SCENARIOS[scenario])
    text = config_text(documents)
    path = writable_config(text, tmp_path)
    every, passes = cred_names(text), cred_names(text, skip=SERVE_ONLY)
    assert "vllm-api-salt" in passes
    containers = 0
    for where, pod in pod_specs(documents):
        for container in pod["containers"]:
            containers += 1
            files = mounted_credentials(pod, container)
            directory = credentials(tmp_path / where / container["name"], set(files))
            env = {"CREDENTIALS_DIRECTORY": str(directory)}
            assert container["args"][container["args"].index("--config") + 1] == "/etc/fleetllm/control-plane.yaml"
            if container["args"][0] == "serve":
                assert set(files) == every, where  # serve resolves every reference at start
                config = load_config(path, env)
                assert config.secrets.fleet_key is not None
                assert config.secrets.fleet_key.reveal() == "value-of-fleet-key-0123456789abcdef"
            else:
                assert container["args"][0] == "reconcile"
                assert set(files) == passes, where  # never the fleet key, webhook secret, admin/viewer tokens
                reconcile = reconcile_config(path, env)
                assert reconcile.settings.secrets.fleet_key is None and reconcile.settings.admin_tokens == ()
                if every - passes:
                    with pytest.raises(ConfigurationError):  # while serve needs every one
                        load_config(path, env)
                clone_dir = reconcile.clone_dir
                assert clone_dir is not None
                writable = {m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")}
                assert str(clone_dir.parent) in writable  # its clone goes beside repo.clone_dir
    assert containers == {"defaults": 2, "everything": 2, "loop": 2, "sqlite": 2, "no-reconciler": 1}[scenario]


def test_the_everything_config_reads_what_its_values_say(tmp_path: Path) -> None:
    documents = render(SCENARIOS["everything"])
    path = writable_config(config_text(documents), tmp_path)
    names = cred_names(path.read_text())
    assert names == {"webhook-secret", "fleet-key", "vllm-api-salt", "previous-vllm-api-salt", "admin-token",
                     "admin-token-1", "viewer-token", "pg-password", "litellm-master-key", "runpod-api-key",
                     "slack-webhook-url"}
    config = load_config(path, {"CREDENTIALS_DIRECTORY": str(credentials(tmp_path, names))})
    assert config.repo.branch == "production" and config.repo.refresh_interval_s == 30
    assert config.state.url.startswith("postgresql://fleet_eu@db.example.com:5432/fleet?")
    assert config.tls is not None and config.trusted_proxies
    assert len(config.admin_tokens) == 2 and len(config.viewer_tokens) == 1
    assert config.reconcile.dry_run is True and config.threads == 16 and config.log_level == "warning"
    pod = one(documents, "Deployment", "fleet-eu-control-plane")["spec"]["template"]["spec"]
    files = mounted_credentials(pod, pod["containers"][0])
    assert files["fleet-key"] == ("fleet-eu-boxes", "boxes-key")  # its own Secret
    assert files["vllm-api-salt"] == ("fleet-eu-credentials", "salt-2026")  # existingSecret
    assert files["admin-token-1"] == ("fleet-eu-oncall", "token")
    assert files["slack-webhook-url"] == ("fleet-eu-slack", "url")


def test_sqlite_keeps_the_state_on_the_claim_beside_the_loop(tmp_path: Path) -> None:
    documents = render(SCENARIOS["sqlite"])
    config = yaml.safe_load(config_text(documents))
    assert config["state"]["url"] == "sqlite:////var/lib/fleetllm/control-plane.sqlite3"
    assert "password" not in config["state"] and "pushgateway" not in config.get("reconcile", {})
    deployment = one(documents, "Deployment")
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"] == {"type": "Recreate"}
    pod = deployment["spec"]["template"]["spec"]
    (state,) = [v for v in pod["volumes"] if v["name"] == "state"]
    assert state["persistentVolumeClaim"] == {"claimName": "fleetllm-state"}
    for container in pod["containers"]:  # both processes see the file and its lock
        assert {"name": "state", "mountPath": "/var/lib/fleetllm"} in container["volumeMounts"]
    claim = one(documents, "PersistentVolumeClaim")
    assert claim["spec"] == {"accessModes": ["ReadWriteOncePod"], "storageClassName": "fast-ssd",
                             "resources": {"requests": {"storage": "5Gi"}}}
    assert claim["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    mine = render(SCENARIOS["no-reconciler"])
    pod = one(mine, "Deployment")["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["containers"]] == ["fleetllm"]
    assert next(v for v in pod["volumes"] if v["name"] == "state")["persistentVolumeClaim"] == {
        "claimName": "fleetllm-state-2026"}
    assert yaml.safe_load(config_text(mine))["reconcile"] == {"enabled": False}


# --- every option is used --------------------------------------------------------------------------------

def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """helm's merge of a values file over the defaults: maps merge, anything else replaces."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


WHOLE = {"resources", "podSecurityContext", "securityContext", "tlsConfig"}  # options that are one map


def leaves(node: dict[str, Any], at: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = []
    for key, value in node.items():
        if isinstance(value, dict) and value and key not in WHOLE:
            out += leaves(value, (*at, key))
        else:
            out.append((*at, key))
    return out


def get(node: dict[str, Any], path: tuple[str, ...]) -> Any:
    for key in path:
        node = node[key]
    return node


def with_default(values: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    out = copy.deepcopy(values)
    get(out, path[:-1])[path[-1]] = copy.deepcopy(get(DEFAULTS, path))
    return out


def test_every_option_changes_what_renders(tmp_path: Path) -> None:
    """Each option of values.yaml, taken back to its default in one of the ci/ values files that sets it
    otherwise, changes the rendered manifests: no option is accepted and then ignored."""
    files = {name: merge(DEFAULTS, yaml.safe_load(paths[0].read_text()))
             for name, paths in SCENARIOS.items() if paths}
    ignored = []
    for path in leaves(DEFAULTS):
        changed = False
        for name, values in files.items():
            if get(values, path) == get(DEFAULTS, path):
                continue
            target = tmp_path / f"{name}-{'.'.join(path)}.yaml"
            target.write_text(yaml.safe_dump(with_default(values, path)))
            full = tmp_path / f"{name}.yaml"
            full.write_text(yaml.safe_dump(values))
            done = run_helm("template", RELEASE, str(CHART), "--values", str(target))
            if done.returncode != 0 or done.stdout != template_text((full,)):
                changed = True
                break
        if not changed:
            ignored.append(".".join(path))
    assert ignored == []


def test_the_check_sees_an_ignored_option(tmp_path: Path) -> None:
    """The comparison above, on an option that is read (the output changes) and on one that is not in that
    setting (a loop never reads the CronJob's schedule: nothing changes)."""
    full, reset = tmp_path / "read.yaml", tmp_path / "read-reset.yaml"
    values = merge(DEFAULTS, {"controlPlane": {"podLabels": {"tier": "control"}}})
    full.write_text(yaml.safe_dump(values))
    reset.write_text(yaml.safe_dump(with_default(values, ("controlPlane", "podLabels"))))
    assert template_text((full,)) != template_text((reset,))
    values = merge(DEFAULTS, {"reconcile": {"mode": "loop", "schedule": "0 * * * *"}})
    full, reset = tmp_path / "unread.yaml", tmp_path / "unread-reset.yaml"
    full.write_text(yaml.safe_dump(values))
    reset.write_text(yaml.safe_dump(with_default(values, ("reconcile", "schedule"))))
    assert template_text((full,)) == template_text((reset,))


# --- refusals: each names the values and what to do, and echoes no secret -------------------------------

@pytest.mark.parametrize(("sets", "says"), [
    (("state.backend=sqlite",), "controlPlane.replicas must be 1"),
    (("state.backend=sqlite", "controlPlane.replicas=1"), "set reconcile.mode loop"),
    (("existingSecret=",), "credential webhook-secret (key \"webhook-secret\"): no Secret to read it from"),
    (("extraCredentials[0].name=fleet-key", "extraCredentials[0].key=k"), "the name \"fleet-key\" is taken"),
    (("state.postgresql.url=postgresql://fleetllm:s3cr3t-sentinel@db.example.com/fleetllm",),
     "state.postgresql.url has a password in it"),
    (("reconcile.pushgateway.url=https://s3cr3t-sentinel@push.example.com",),
     "reconcile.pushgateway.url carries a credential"),
    (("secrets.fleetKey=s3cr3t-sentinel",), "/secrets/fleetKey"),
])
def test_helm_refuses(sets: tuple[str, ...], says: str) -> None:
    error = template_error(sets=sets)
    assert says in error
    assert "s3cr3t-sentinel" not in error


def strings(node: Any) -> list[str]:
    if isinstance(node, dict):
        return [s for value in node.values() for s in strings(value)]
    if isinstance(node, list):
        return [s for value in node for s in strings(value)]
    return [node] if isinstance(node, str) else []


def test_no_secret_value_in_what_renders() -> None:
    """The chart has nowhere to put a secret: it renders no Secret, every reference of the config is to a
    mounted file (fleetllm's reader refuses a secret field that is not a reference: the loads above), and
    no environment variable carries a value but the credentials directory."""
    for scenario, paths in SCENARIOS.items():
        documents = render(paths)
        assert "Secret" not in {d["kind"] for d in documents}
        references = [s for s in strings(yaml.safe_load(config_text(documents))) if "${" in s]
        assert references, scenario
        assert all(re.fullmatch(r"\$\{cred:[-\w.]+\}", s) for s in references), (scenario, references)
        for where, pod in pod_specs(documents):
            for container in pod["containers"]:
                plain = {e["name"]: e["value"] for e in container["env"] if "value" in e}
                assert plain == {"CREDENTIALS_DIRECTORY": "/run/credentials/fleetllm"}, where
                assert "envFrom" not in container, where
