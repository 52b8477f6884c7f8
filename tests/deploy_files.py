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
JOB_RULES = PROMETHEUS_DIR / "job.yml"
JOB_RULE_TESTS = PROMETHEUS_DIR / "job_test.yml"
FLEET_RULES = PROMETHEUS_DIR / "fleet.yml"
FLEET_RULE_TESTS = PROMETHEUS_DIR / "fleet_test.yml"
# job.yml under churn: a job that finished, two rulers, CPU devices; and restarts (goodput's disruption and redone).
CHURN_RULE_TESTS = PROMETHEUS_DIR / "job_churn_test.yml"
RESTART_RULE_TESTS = PROMETHEUS_DIR / "job_restart_test.yml"
PROMETHEUS_CONFIG = PROMETHEUS_DIR / "prometheus.yml"
KUBERNETES = DEPLOY / "kubernetes"
COMPOSE = DEPLOY / "docker-compose.yml"
DASHBOARD = ROOT / "grafana" / "dashboards" / "jaxmon.json"
JOB_DASHBOARD = ROOT / "grafana" / "dashboards" / "jaxmon-job.json"
# Every dashboard file (deploy/generate.py writes them all): the main one, the Job, JAX training and fleet ones.
DASHBOARDS = sorted(DASHBOARD.parent.glob("*.json"))
PROVISIONING = ROOT / "grafana" / "provisioning"
DOCKERFILE = ROOT / "Dockerfile"
DOCS = ROOT / "docs" / "deploy.md"
METRICS_REFERENCE = ROOT / "docs" / "metrics.md"
DEFAULT_PORT = 10401


METRIC_TOKEN = re.compile(r"\bjaxmon_[a-z0-9_]+\b")


def readme_metrics() -> dict[str, str]:
    """The metrics reference, docs/metrics.md (generated from the code by `python -m jaxmon.families.reference`; the
    README links to it): name -> type; a histogram's row stands for its _bucket, _sum and _count series, a
    summary's for its quantile series, _sum and _count."""
    out: dict[str, str] = {}
    for line in METRICS_REFERENCE.read_text(encoding="utf-8").splitlines():
        m = re.match(r"^\| `(jaxmon_[a-z0-9_]+)` \| ([a-z]+)", line)
        if m and m.group(2) == "histogram":
            out.update({m.group(1) + suffix: "histogram" for suffix in ("_bucket", "_sum", "_count")})
        elif m and m.group(2) == "summary":
            out.update({m.group(1) + suffix: "summary" for suffix in ("", "_sum", "_count")})
        elif m:
            out[m.group(1)] = m.group(2)
    assert len(out) > 30, "the metrics table of docs/metrics.md was not found"
    return out


# libyaml's parser (in PyYAML's wheels) with PyYAML's safe constructor: what yaml.safe_load reads, 10-20 times faster
# (the rules files and manifests are thousands of lines, read by many tests).
SAFE_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def parse_yaml(text: str) -> Any:
    """yaml.safe_load(text), by libyaml."""
    return yaml.load(text, Loader=SAFE_LOADER)


def load_yaml(path: Path) -> Any:
    return parse_yaml(path.read_text(encoding="utf-8"))


def alert_rules(path: Path = RULES) -> list[dict[str, Any]]:
    """Every alerting rule of a rules file (deploy/prometheus/alerts.yml unless told)."""
    return [rule for group in load_yaml(path)["groups"] for rule in group["rules"] if "alert" in rule]


def recording_rules(path: Path = JOB_RULES) -> list[dict[str, Any]]:
    """Every recording rule of a rules file (deploy/prometheus/job.yml unless told)."""
    return [rule for group in load_yaml(path)["groups"] for rule in group["rules"] if "record" in rule]


def dashboard(path: Path = DASHBOARD) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def dashboard_panels(path: Path = DASHBOARD) -> list[dict[str, Any]]:
    """Every panel that is not a row (rows nested in collapsed rows included)."""
    out: list[dict[str, Any]] = []
    for panel in dashboard(path)["panels"]:
        if panel["type"] == "row":
            out.extend(panel.get("panels", []))
        else:
            out.append(panel)
    return out


def dashboard_targets(path: Path = DASHBOARD) -> list[tuple[str, str, str]]:
    """(panel title, refId, expr) of every panel query."""
    return [(p["title"], t["refId"], t["expr"]) for p in dashboard_panels(path) for t in p["targets"]]


def dashboard_variables(path: Path = DASHBOARD) -> list[dict[str, Any]]:
    variables: list[dict[str, Any]] = dashboard(path)["templating"]["list"]
    return variables


def variable_query(variable: dict[str, Any]) -> str:
    query = variable["query"]
    return str(query["query"] if isinstance(query, dict) else query)


def metric_tokens(text: str) -> set[str]:
    return set(METRIC_TOKEN.findall(text))


RECORD_TOKEN = re.compile(r"\bjaxmon:[a-z0-9_:]+\b")


def record_tokens(text: str) -> set[str]:
    """The jaxmon: recorded series named in `text`."""
    return set(RECORD_TOKEN.findall(text))


def readme_records() -> set[str]:
    """The recorded series docs/job-rules.md's table lists (a row may name several)."""
    text = (ROOT / "docs" / "job-rules.md").read_text(encoding="utf-8")
    rows = [line.split("|")[1] for line in text.splitlines() if line.startswith("| `jaxmon:")]
    return set().union(*(record_tokens(row) for row in rows))


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


def k8s_documents() -> list[dict[str, Any]]:
    """Every object of deploy/kubernetes/*.yaml, the files in name order."""
    docs: list[dict[str, Any]] = []
    for path in sorted(KUBERNETES.glob("*.yaml")):
        with path.open(encoding="utf-8") as fh:
            docs.extend(d for d in yaml.load_all(fh, Loader=SAFE_LOADER) if d is not None)
    return docs


def named(kind: str, name: str) -> dict[str, Any]:
    """The one manifest object of `kind` called `name`."""
    (doc,) = [d for d in k8s_documents() if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc
