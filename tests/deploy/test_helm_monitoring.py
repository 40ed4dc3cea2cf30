"""The chart's monitoring objects: its PrometheusRule is deploy/prometheus/fleetllm.rules.yml (the copy in
the chart equals it, the rendered groups equal its groups, and promtool's checks and unit tests pass on the
rendered groups), its dashboard ConfigMap is deploy/grafana/fleetllm.json, and its ServiceMonitor scrapes
/metrics on ports that lead to the pods serving them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.chart import CHART, SCENARIOS, config_text, one, render
from tests.deploy.promql import dashboard_file, rules_file
from tests.deploy.test_prometheus_rules import TESTS, alerts, run

RULES_BASE = "https://git.example.com/fleetllm/fleetllm/blob/main/docs/runbooks.md"
MONITORING = ("prometheusRule.enabled=true", "grafanaDashboard.enabled=true", "serviceMonitor.enabled=true")


@pytest.mark.parametrize(("copy", "source"), [(CHART / "files" / "fleetllm.rules.yml", rules_file()),
                                              (CHART / "files" / "fleetllm.json", dashboard_file())])
def test_the_charts_copy_is_the_source(copy: Path, source: Path) -> None:
    """helm reads files inside the chart only: files/ keeps copies. Change the source, then copy it:
    cp deploy/prometheus/fleetllm.rules.yml deploy/grafana/fleetllm.json deploy/helm/fleetllm/files/"""
    assert copy.read_bytes() == source.read_bytes(), f"{copy} differs from {source}: copy it again"


def prometheus_rule(sets: tuple[str, ...] = MONITORING) -> dict[str, Any]:
    return one(render(sets=sets), "PrometheusRule")


def test_the_rendered_groups_are_the_rules_files() -> None:
    rule = prometheus_rule()
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(rule["spec"]) == {"groups"}
    assert rule["spec"] == yaml.safe_load(rules_file().read_text())


def test_promtool_checks_and_unit_tests_pass_on_the_rendered_groups(tmp_path: Path) -> None:
    """fleetllm.rules.test.yml run against the rules as the chart deploys them (its rule_files names
    fleetllm.rules.yml: the rendered groups are written under that name)."""
    (tmp_path / rules_file().name).write_text(yaml.safe_dump(prometheus_rule()["spec"], sort_keys=False))
    shutil.copy(TESTS, tmp_path / TESTS.name)
    done = run("check", "rules", rules_file().name, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in done.stdout
    done = run("test", "rules", TESTS.name, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_the_runbook_url_base_is_replaced_and_nothing_else() -> None:
    base = "https://docs.example.com/ops/fleetllm-runbooks.html"
    rule = prometheus_rule((*MONITORING, f"prometheusRule.runbookUrl={base}"))
    source = yaml.safe_load(rules_file().read_text())
    urls = []
    for group, shipped in zip(rule["spec"]["groups"], source["groups"], strict=True):
        for mine, theirs in zip(group["rules"], shipped["rules"], strict=True):
            if "alert" in theirs:
                urls.append(mine["annotations"]["runbook_url"])
                assert mine["annotations"]["runbook_url"] == theirs["annotations"]["runbook_url"].replace(RULES_BASE, base)
                mine["annotations"]["runbook_url"] = theirs["annotations"]["runbook_url"]
    assert len(urls) == len(alerts()) and all(u.startswith(f"{base}#fleetllm") for u in urls)
    assert rule["spec"] == source  # nothing else changed


def test_the_dashboard_configmap_is_the_dashboard() -> None:
    configmap = one(render(sets=MONITORING), "ConfigMap", "fleetllm-dashboard")
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"  # the sidecar's default label
    assert json.loads(configmap["data"]["fleetllm.json"]) == json.loads(dashboard_file().read_text())


def test_monitoring_is_off_by_default() -> None:
    kinds = {(d["kind"], d["metadata"]["name"]) for d in render()}
    assert not {k for k, _ in kinds} & {"PrometheusRule", "ServiceMonitor"}
    assert ("ConfigMap", "fleetllm-dashboard") not in kinds


def scraped(documents: list[dict[str, Any]]) -> set[tuple[str, str, int]]:
    """(Service, container, container port) of every endpoint of the ServiceMonitor: the Services it selects
    that have the endpoint's port, and the containers of the pods those select that serve it."""
    monitor = one(documents, "ServiceMonitor")
    selector = monitor["spec"]["selector"]["matchLabels"]
    services = [d for d in documents if d["kind"] == "Service"
                and selector.items() <= d["metadata"]["labels"].items()]
    workloads = [d for d in documents if d["kind"] == "Deployment"]
    found = set()
    for endpoint in monitor["spec"]["endpoints"]:
        assert endpoint["path"] == "/metrics"
        hits = 0
        for service in services:
            for port in service["spec"]["ports"]:
                if port["name"] != endpoint["port"]:
                    continue
                for workload in workloads:
                    template = workload["spec"]["template"]
                    if not service["spec"]["selector"].items() <= template["metadata"]["labels"].items():
                        continue
                    for container in template["spec"]["containers"]:
                        for served in container.get("ports", ()):
                            if served["name"] == port["targetPort"]:
                                hits += 1
                                found.add((service["metadata"]["name"], container["name"], served["containerPort"]))
        assert hits, f"the endpoint on port {endpoint['port']} reaches no container"
    return found


@pytest.mark.parametrize(("scenario", "expected"), [
    ("everything", {("fleet-eu", "fleetllm", 8080)}),  # a CronJob pushes to the Pushgateway instead
    ("loop", {("fleetllm", "fleetllm", 8080), ("fleetllm-reconcile", "reconcile", 9500)}),
    ("sqlite", {("fleetllm", "fleetllm", 8080), ("fleetllm", "reconcile", 9464)}),
])
def test_the_service_monitor_reaches_every_metrics_port(scenario: str, expected: set[tuple[str, str, int]]) -> None:
    documents = render(SCENARIOS[scenario])
    assert scraped(documents) == expected
    for workload in documents:
        if workload["kind"] != "Deployment":
            continue
        for container in workload["spec"]["template"]["spec"]["containers"]:
            for probe in (container["livenessProbe"]["httpGet"], container["startupProbe"]["httpGet"]):
                # the scraped process keeps the pod alive, on a path the probe may ask without a token
                assert probe["path"] == "/health/live"
                assert probe["port"] in {p["name"] for p in container["ports"]}


@pytest.mark.parametrize(("scenario", "secret", "key"), [
    ("everything", "fleet-eu-monitoring", "scrape-token"),  # a Secret of its own
    ("loop", "fleetllm-credentials", "metrics-token"),  # the default: existingSecret's metrics-token
    ("sqlite", "fleetllm-credentials", "metrics-token"),
])
def test_every_endpoint_sends_the_metrics_token_the_config_requires(scenario: str, secret: str, key: str) -> None:
    """/metrics needs metrics_token (issue 27: it names every box and pod): the config refers to the same Secret
    key that every endpoint of the ServiceMonitor sends as its bearer."""
    documents = render(SCENARIOS[scenario])
    monitor = one(documents, "ServiceMonitor")
    for endpoint in monitor["spec"]["endpoints"]:
        assert endpoint["authorization"] == {"type": "Bearer", "credentials": {"name": secret, "key": key}}
        assert "bearerTokenSecret" not in endpoint  # the deprecated field: one way only
    assert "metrics_token: ${cred:metrics-token}" in config_text(documents)


def test_a_metrics_token_key_of_nothing_leaves_metrics_public() -> None:
    documents = render(SCENARIOS["loop"], sets=("metricsToken.key=",))
    monitor = one(documents, "ServiceMonitor")
    assert all("authorization" not in endpoint for endpoint in monitor["spec"]["endpoints"])
    assert "metrics_token" not in config_text(documents)


def test_with_tls_in_the_pod_prometheus_scrapes_https() -> None:
    monitor = one(render(SCENARIOS["everything"]), "ServiceMonitor")
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "https" and endpoint["scheme"] == "https"
    assert endpoint["tlsConfig"]["serverName"] == "fleet.eu.example.com"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
