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
from tests.conftest import ROOT
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


SSO = {"enabled": True, "issuer": "https://sso.example.com", "clientId": "fleetllm", "roles": {"ops": "operator"},
       "redirectBase": "https://fleet.example.com"}  # the least auth.oidc that is on


def with_values(path: str, value: Any, base: dict[str, Any] | None = None) -> dict[str, Any]:
    values = copy.deepcopy(DEFAULTS if base is None else base)
    *parents, last = path.split(".")
    node = values
    for key in parents:
        node = node[key]
    node[last] = value
    return values


@pytest.mark.parametrize(("path", "value"), [
    ("secrets.fleetKey", "s3cr3t-sentinel"),  # a value instead of a reference
    ("state.postgresql.password", "s3cr3t-sentinel"),
    ("adminTokens", ["s3cr3t-sentinel"]),
    ("operatorTokens", ["s3cr3t-sentinel"]),
    ("viewerTokens", [{"name": "grafana", "token": "s3cr3t-sentinel"}]),  # the config's form, with a value
    ("operatorTokens", [{"name": "deploy-bot", "key": "k", "value": "s3cr3t-sentinel"}]),
    ("operatorTokens", [{"name": "deploy bot", "key": "k"}]),  # not a name the audit trail takes
    ("operatorTokens", [{"name": "deploy-bot"}]),  # no key
    ("secrets.vllmApiSalt", {"key": "vllm-api-salt", "value": "s3cr3t-sentinel"}),
    ("secrets.vllmApiSalt", {"key": ""}),  # the salt is required
    ("controlPlane.replicaz", 3),  # a typo
    ("auth.oidc.enabled", True),  # and nothing else: no issuer, client or roles
    ("auth.oidc.clientSecret", "s3cr3t-sentinel"),
    ("auth.oidc.clientSecret", {"key": "oidc-client-secret", "value": "s3cr3t-sentinel"}),
    ("auth.oidc.clientSecretz", {"key": "oidc-client-secret"}),
    ("auth.oidc.client_id", "fleetllm"),  # the config's spelling, not the values'
    ("auth.saml", {}),
    ("auth.oidc.roles", {"ops": "root"}),
    ("auth.oidc.leewayS", 301),
    ("auth.oidc.timeoutS", 0),
    ("auth.oidc.redirectBase", "fleet.example.com"),
    ("auth.oidc.groupsClaim", "realm_access..roles"),
])
def test_values_schema_refuses(path: str, value: Any) -> None:
    assert list(jsonschema.Draft7Validator(SCHEMA).iter_errors(with_values(path, value))), path


@pytest.mark.parametrize(("path", "value"), [
    ("issuer", ""), ("issuer", "sso.example.com"), ("clientId", ""), ("clientId", "fleet llm"),
    ("clientSecret", {"key": ""}), ("roles", {}),
])
def test_values_schema_refuses_sso_on_without_what_it_needs(path: str, value: Any) -> None:
    validator = jsonschema.Draft7Validator(SCHEMA)
    on = with_values("auth.oidc", {**DEFAULTS["auth"]["oidc"], **SSO})
    assert list(validator.iter_errors(on)) == []
    assert list(validator.iter_errors(with_values(f"auth.oidc.{path}", value, on))), path
    off = with_values("auth.oidc.enabled", False, on)
    assert list(validator.iter_errors(with_values(f"auth.oidc.{path}", value, off))) == [], path  # off: unread


# values key of auth.oidc -> the control plane's config key (schemas/control-plane.schema.json)
OIDC_KEYS = {"issuer": "issuer", "clientId": "client_id", "redirectBase": "redirect_base", "scopes": "scopes",
             "groupsClaim": "groups_claim", "roles": "roles", "leewayS": "leeway_s", "timeoutS": "timeout_s",
             "acceptBearerJwts": "accept_bearer_jwts"}
CONSTRAINTS = ("pattern", "minimum", "maximum", "exclusiveMinimum", "maxLength", "enum", "uniqueItems")


def test_the_values_schema_checks_what_the_control_plane_does() -> None:
    """Each SSO setting and token name is held to the control plane's own limits (a pattern without its
    Python-only end anchor, which Go's regexp, helm's, cannot read): no value helm takes is refused at start,
    but a setting "" or null that means the control plane's default."""
    config = json.loads((ROOT / "schemas" / "control-plane.schema.json").read_text())
    theirs = config["properties"]["auth"]["properties"]["oidc"]
    oidc = SCHEMA["properties"]["auth"]["properties"]["oidc"]
    when_on = oidc["then"]["properties"]

    def limits(node: dict[str, Any]) -> dict[str, Any]:
        out = {k: node[k] for k in CONSTRAINTS if k in node}
        if "pattern" in out:
            out["pattern"] = out["pattern"].removesuffix("(?![\\s\\S])")
        for inner in ("items", "additionalProperties"):  # a list's items, a mapping's values
            if isinstance(node.get(inner), dict):
                out |= {f"{inner}.{k}": v for k, v in limits(node[inner]).items()}
        return out

    compared = 0
    for mine, key in OIDC_KEYS.items():
        expected = limits(theirs["properties"][key])
        have = {**limits(oidc["properties"][mine]), **limits(when_on.get(mine, {}))}
        if mine in {"redirectBase", "groupsClaim"}:  # "" is the default (the Ingress's host, the schema's)
            have["pattern"] = re.sub(r"^\^\((.*)\)\?\$$", r"^\1$", have["pattern"])
        assert have == expected, mine
        compared += len(expected)
    assert compared >= 10
    token = config["$defs"]["api_token"]["anyOf"][1]["properties"]["name"]["pattern"]
    assert SCHEMA["definitions"]["token"]["properties"]["name"]["pattern"] + "(?![\\s\\S])" == token
    assert set(theirs["properties"]) == {*OIDC_KEYS.values(), "client_secret"}  # every key has a value


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
    assert "fleet-eu-ci/deploy-bot -> ${cred:operator-token}  (operator token deploy-bot)" in notes
    assert "fleet-eu-credentials/operator-oncall -> ${cred:operator-token-1}  (operator token)\n" in notes
    assert "fleet-eu-sso/client-secret -> ${cred:oidc-client-secret}  (the single sign-on client's secret)" in notes
    assert "redirect URI https://fleet-eu.example.com/oidc/callback" in notes
    assert "3 control-plane replica(s) on postgresql, the reconciler as a cronjob" in notes
    done = run_helm("install", RELEASE, str(CHART), "--dry-run=client", "--namespace", "fleetllm")
    assert done.returncode == 0, done.stderr
    assert "oidc" not in done.stdout[done.stdout.index("NOTES:"):]  # single sign-on is off by default


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
                assert (config.oidc is not None) == (scenario == "everything")
            else:
                assert container["args"][0] == "reconcile"
                assert set(files) == passes, where  # never the fleet key, webhook secret, tokens, SSO secret
                reconcile = reconcile_config(path, env)
                assert reconcile.settings.secrets.fleet_key is None and reconcile.settings.admin_tokens == ()
                assert reconcile.settings.operator_tokens == () and reconcile.settings.oidc is None
                assert not {"oidc-client-secret", "operator-token"} & set(files), where
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
                     "admin-token-1", "operator-token", "operator-token-1", "viewer-token", "metrics-token",
                     "oidc-client-secret", "pg-password", "litellm-master-key", "runpod-api-key", "slack-webhook-url"}
    config = load_config(path, {"CREDENTIALS_DIRECTORY": str(credentials(tmp_path, names))})
    assert config.repo.branch == "production" and config.repo.refresh_interval_s == 30
    assert config.state.url.startswith("postgresql://fleet_eu@db.example.com:5432/fleet?")
    assert config.tls is not None and config.trusted_proxies
    tokens = {role: [(t.name, t.secret.reference) for t in getattr(config, f"{role}_tokens")]
              for role in ("admin", "operator", "viewer")}
    assert tokens == {"admin": [("alice", "${cred:admin-token}"), (None, "${cred:admin-token-1}")],
                      "operator": [("deploy-bot", "${cred:operator-token}"), (None, "${cred:operator-token-1}")],
                      "viewer": [("dashboard@grafana", "${cred:viewer-token}")]}
    assert config.metrics_token is not None and config.metrics_token.reference == "${cred:metrics-token}"
    oidc = config.oidc
    assert oidc is not None
    assert (oidc.issuer, oidc.client_id, oidc.redirect_base) == (
        "https://keycloak.example.com/realms/fleet", "fleet-eu", "https://fleet-eu.example.com")
    assert oidc.client_secret.reference == "${cred:oidc-client-secret}"
    assert oidc.client_secret.reveal() == "value-of-oidc-client-secret-0123456789abcdef"
    assert oidc.scopes == ("openid", "email", "profile", "groups")
    assert oidc.groups_claim == ("realm_access", "roles")
    assert oidc.roles == {"fleet-eu-viewers": "viewer", "org:fleet-eu-operators": "operator",
                          "/platform/fleet-admins": "admin"}
    assert (oidc.accept_bearer_jwts, oidc.leeway_s, oidc.timeout_s) == (True, 30, 2.5)
    assert config.reconcile.dry_run is True and config.threads == 16 and config.log_level == "warning"
    pod = one(documents, "Deployment", "fleet-eu-control-plane")["spec"]["template"]["spec"]
    files = mounted_credentials(pod, pod["containers"][0])
    assert files["fleet-key"] == ("fleet-eu-boxes", "boxes-key")  # its own Secret
    assert files["vllm-api-salt"] == ("fleet-eu-credentials", "salt-2026")  # existingSecret
    assert files["admin-token-1"] == ("fleet-eu-oncall", "token")
    assert files["operator-token"] == ("fleet-eu-ci", "deploy-bot")
    assert files["oidc-client-secret"] == ("fleet-eu-sso", "client-secret")
    assert files["slack-webhook-url"] == ("fleet-eu-slack", "url")
    assert files["metrics-token"] == ("fleet-eu-monitoring", "scrape-token")


def test_single_sign_on_takes_the_control_planes_defaults_and_the_ingress_host(tmp_path: Path) -> None:
    """SSO with only what it needs: the optional settings are left to the control plane's schema defaults
    (the chart writes none of its own), and redirect_base is the Ingress's host; a token's file follows its
    place in its list, one with key "" is dropped, and its name goes with it."""
    values = tmp_path / "sso-values.yaml"
    values.write_text(yaml.safe_dump({
        "auth": {"oidc": {**SSO, "redirectBase": "", "clientSecret": {"secret": "sso", "key": "secret"}}},
        "ingress": {"enabled": True, "host": "fleet.example.org"},
        "operatorTokens": [{"name": "unused", "key": ""}, {"name": "deploy-bot", "key": "bot"}]}))
    documents = render((values,))
    text = config_text(documents)
    written = yaml.safe_load(text)
    assert written["auth"] == {"oidc": {"issuer": "https://sso.example.com", "client_id": "fleetllm",
                                        "client_secret": "${cred:oidc-client-secret}",
                                        "redirect_base": "https://fleet.example.org", "roles": {"ops": "operator"}}}
    assert written["operator_tokens"] == [{"name": "deploy-bot", "token": "${cred:operator-token-1}"}]
    path = writable_config(text, tmp_path)
    config = load_config(path, {"CREDENTIALS_DIRECTORY": str(credentials(tmp_path, cred_names(text)))})
    oidc = config.oidc
    assert oidc is not None and oidc.redirect_base == "https://fleet.example.org"
    defaults = json.loads((ROOT / "schemas" / "control-plane.schema.json").read_text())
    theirs = defaults["properties"]["auth"]["properties"]["oidc"]["properties"]
    assert [list(oidc.scopes), ".".join(oidc.groups_claim), oidc.accept_bearer_jwts, oidc.leeway_s,
            oidc.timeout_s] == [theirs[k]["default"] for k in ("scopes", "groups_claim", "accept_bearer_jwts",
                                                                "leeway_s", "timeout_s")]
    pod = one(documents, "Deployment")["spec"]["template"]["spec"]
    files = mounted_credentials(pod, pod["containers"][0])
    assert files["oidc-client-secret"] == ("sso", "secret") and files["operator-token-1"] == (
        "fleetllm-credentials", "bot")
    assert "operator-token" not in files


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


def test_every_option_of_a_list_entry_changes_what_renders(tmp_path: Path) -> None:
    """The same for each key of each entry of a list option (a token's name, its Secret; a toleration's
    fields): taking it out of its entry in a ci/ values file changes the rendered manifests, or is refused."""
    ignored, seen = [], set()
    for name, paths in SCENARIOS.items():
        if not paths:
            continue
        values = merge(DEFAULTS, yaml.safe_load(paths[0].read_text()))
        full = tmp_path / f"{name}.yaml"
        full.write_text(yaml.safe_dump(values))
        for path in leaves(DEFAULTS):
            entries = get(values, path)
            if not isinstance(entries, list):
                continue
            for i, entry in enumerate(entries):
                for key in entry if isinstance(entry, dict) else ():
                    changed = copy.deepcopy(values)
                    del get(changed, path)[i][key]
                    target = tmp_path / f"{name}-{'.'.join(path)}-{i}-{key}.yaml"
                    target.write_text(yaml.safe_dump(changed))
                    done = run_helm("template", RELEASE, str(CHART), "--values", str(target))
                    seen.add(f"{'.'.join(path)}[].{key}")
                    if done.returncode == 0 and done.stdout == template_text((full,)):
                        ignored.append(f"{name}: {'.'.join(path)}[{i}].{key}")
    assert ignored == []
    assert {f"{tokens}[].{key}" for tokens in ("adminTokens", "operatorTokens", "viewerTokens")
            for key in ("name", "secret", "key")} - {"viewerTokens[].secret"} <= seen


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
    (("auth.oidc.clientSecret=s3cr3t-sentinel",), "/auth/oidc/clientSecret"),
    (("operatorTokens[0]=s3cr3t-sentinel",), "/operatorTokens/0"),
    (("adminTokens[0].name=oncall", "adminTokens[0].key=k", "operatorTokens[0].name=oncall", "operatorTokens[0].key=k"),
     "adminTokens[0].name and operatorTokens[0].name are both \"oncall\": give each token its own name"),
    (("auth.oidc.enabled=true", "auth.oidc.issuer=https://sso.example.com", "auth.oidc.clientId=fleetllm",
      "auth.oidc.roles.ops=operator"), "auth.oidc.redirectBase is empty and ingress.enabled is false"),
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
