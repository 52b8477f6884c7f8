"""The deployment files the tests check, and the readers shared by tests/unit/test_deploy.py (everything that
needs no process), tests/e2e/test_deploy.py (promtool, hadolint, the generator, the demo trainer, the HEALTHCHECK)
and tests/e2e/test_prometheus.py (the rules and dashboard queries against a real Prometheus).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from tests.helpers import ROOT

DEPLOY = ROOT / "deploy"
PROMETHEUS_DIR = DEPLOY / "prometheus"
RULES = PROMETHEUS_DIR / "alerts.yml"
RULE_TESTS = PROMETHEUS_DIR / "alerts_test.yml"
PROMETHEUS_CONFIG = PROMETHEUS_DIR / "prometheus.yml"
KUBERNETES = DEPLOY / "kubernetes"
COMPOSE = DEPLOY / "docker-compose.yml"
DASHBOARD = ROOT / "grafana" / "dashboards" / "jaxmon.json"
PROVISIONING = ROOT / "grafana" / "provisioning"
DOCKERFILE = ROOT / "Dockerfile"
DOCS = ROOT / "docs" / "deploy.md"
DEFAULT_PORT = 10401


METRIC_TOKEN = re.compile(r"\bjaxmon_[a-z0-9_]+\b")


def readme_metrics() -> dict[str, str]:
    """The metrics reference of README.md (the names there are the truth): name -> type."""
    out: dict[str, str] = {}
    for line in (ROOT / "README.md").read_text(encoding="utf-8").splitlines():
        m = re.match(r"^\| `(jaxmon_[a-z0-9_]+)` \| ([a-z]+)", line)
        if m:
            out[m.group(1)] = m.group(2)
    assert len(out) > 30, "the README metrics table was not found"
    return out


def load_yaml(path: Path) -> Any:
    with path.open(encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def alert_rules() -> list[dict[str, Any]]:
    """Every alerting rule of deploy/prometheus/alerts.yml."""
    return [rule for group in load_yaml(RULES)["groups"] for rule in group["rules"] if "alert" in rule]


def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return data


def dashboard_panels() -> list[dict[str, Any]]:
    """Every panel that is not a row (rows nested in collapsed rows included)."""
    out: list[dict[str, Any]] = []
    for panel in dashboard()["panels"]:
        if panel["type"] == "row":
            out.extend(panel.get("panels", []))
        else:
            out.append(panel)
    return out


def dashboard_targets() -> list[tuple[str, str, str]]:
    """(panel title, refId, expr) of every panel query."""
    return [(p["title"], t["refId"], t["expr"]) for p in dashboard_panels() for t in p["targets"]]


def dashboard_variables() -> list[dict[str, Any]]:
    variables: list[dict[str, Any]] = dashboard()["templating"]["list"]
    return variables


def variable_query(variable: dict[str, Any]) -> str:
    query = variable["query"]
    return str(query["query"] if isinstance(query, dict) else query)


def metric_tokens(text: str) -> set[str]:
    return set(METRIC_TOKEN.findall(text))


def dockerfile_stages() -> list[list[tuple[str, str]]]:
    """The Dockerfile's instructions, (INSTRUCTION, arguments), continuation lines joined, split into stages."""
    logical: list[str] = []
    pending = ""
    for raw in DOCKERFILE.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    stages: list[list[tuple[str, str]]] = [[]]
    for line in logical:
        instruction, _, args = line.partition(" ")
        if instruction.upper() == "FROM":
            stages.append([])
        stages[-1].append((instruction.upper(), args.strip()))
    return stages
