"""What the alert rules and the dashboard query, read with a real PromQL parser (promql-parser, the
GreptimeDB parser's Python binding), and what the code exports (docs/gen_metrics_reference.py, which
instantiates the control plane's and the reconciler's registries)."""

from __future__ import annotations

import importlib.util
import re
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import promql_parser

from tests.conftest import ROOT

# Grafana's variables, replaced by a value of their kind before parsing.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "6h"}
# Labels Prometheus adds to every scraped series.
TARGET_LABELS = frozenset({"job", "instance"})


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_metrics_reference", ROOT / "docs" / "gen_metrics_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@cache
def exported() -> dict[str, frozenset[str]]:
    """Series name -> its labels, for every metric the code exports."""
    return {family.series: frozenset(family.labels) for family in generator().exported()}


@dataclass(frozen=True)
class Selector:
    name: str | None
    labels: frozenset[str]


def selectors(expr: str) -> list[Selector]:
    """Every vector selector of `expr` (ValueError if it does not parse)."""
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    found: list[Selector] = []

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            labels = frozenset(m.name for m in node.matchers.matchers)
            name = node.name
            if name is None:  # {__name__="..."}
                name = next((m.value for m in node.matchers.matchers if m.name == "__name__"), None)
            found.append(Selector(name, labels - {"__name__"}))

    promql_parser.walk(promql_parser.parse(expr), visit)
    return found


def problems(where: str, expr: str) -> list[str]:
    """What is wrong with one query: it does not parse, names no metric, names a metric the code does not
    export, or matches on a label that metric does not have."""
    try:
        found = selectors(expr)
    except ValueError as exc:
        return [f"{where}: does not parse: {exc}: {expr}"]
    if not found:
        return [f"{where}: queries no metric: {expr}"]
    known = exported()
    out = []
    for selector in found:
        if selector.name not in known:
            out.append(f"{where}: {selector.name!r} is not a metric fleetllm exports (docs/metrics.md)")
        elif extra := selector.labels - known[selector.name] - TARGET_LABELS:
            out.append(f"{where}: {selector.name} has no label {sorted(extra)}")
    return out


TEMPLATE_METRIC = re.compile(r"\bfleetllm_[a-z0-9_]+")


def template_metrics(text: str) -> set[str]:
    """Metric names a `query` in an alert's annotation template uses (a printf template, not PromQL)."""
    return set(TEMPLATE_METRIC.findall(text))


def rules_file() -> Path:
    return ROOT / "deploy" / "prometheus" / "fleetllm.rules.yml"


def dashboard_file() -> Path:
    return ROOT / "deploy" / "grafana" / "fleetllm.json"
