"""The job view's files read in-process: deploy/prometheus/job.yml and its tests, the recorded series in the README,
the parameters, and the Job dashboard. promtool runs them in tests/e2e/test_deploy.py; a real Prometheus over a
real 4-process JAX job in tests/e2e/test_job_view.py."""

from __future__ import annotations

import json
import re

from tests.dashboard_bounds import unbounded
from tests.deploy_files import (
    DOCS,
    JOB_DASHBOARD,
    JOB_RULE_TESTS,
    JOB_RULES,
    alert_rules,
    dashboard,
    dashboard_panels,
    dashboard_targets,
    dashboard_variables,
    load_yaml,
    metric_tokens,
    readme_metrics,
    readme_records,
    record_tokens,
    recording_rules,
)

JOB_ALERTS = {
    "JaxmonTrainingStraggler",
    "JaxmonTrainingComputeStraggler",
    "JaxmonTrainingProcessStalled",
    "JaxmonDeviceMemorySkew",
    "JaxmonTrainingAxisOnSlowLink",
}
# Each alert's labels must name what it is about: a process, a device, or a mesh axis of a job and its link.
NAMES_A_PROCESS = {"workload", "process_index"}
NAMES_A_DEVICE = {"instance", "platform", "device"}
NAMES_AN_AXIS = {"workload", "axes", "link"}


def test_every_recorded_series_is_in_the_readme_and_nothing_else_is() -> None:
    recorded = {r["record"] for r in recording_rules()}
    assert recorded == readme_records()
    assert all(re.fullmatch(r"jaxmon:[a-z0-9_]+(:[a-z0-9_]+)?", name) for name in recorded), recorded


def test_the_job_files_name_only_series_that_exist() -> None:
    """Every jaxmon_ metric in job.yml, its tests and the Job dashboard is in the README reference, and every
    jaxmon: series they use is recorded by job.yml."""
    known = set(readme_metrics())
    recorded = {r["record"] for r in recording_rules()}
    texts = {
        "job.yml": JOB_RULES.read_text(encoding="utf-8"),
        "job_test.yml": JOB_RULE_TESTS.read_text(encoding="utf-8"),
        "jaxmon-job.json": json.dumps([t[2] for t in dashboard_targets(JOB_DASHBOARD)]),
    }
    for source, text in texts.items():
        assert metric_tokens(text) - known == set(), source
        # A rule test may feed the recorded series' inputs only; what it asserts on must be recorded.
        assert record_tokens(text) - recorded == set(), source


def test_thresholds_are_parameters_recorded_once_and_used() -> None:
    params = [r for r in recording_rules() if r["record"].startswith("jaxmon:param:")]
    assert len(params) >= 4
    # An alert reads a parameter, or a record it reads does (compute_straggler_samples: which processes count).
    rules_text = json.dumps([r["expr"] for r in alert_rules(JOB_RULES) + recording_rules()])
    docs = DOCS.read_text(encoding="utf-8")
    for rule in params:
        assert re.fullmatch(r"vector\([0-9.]+\)", rule["expr"]), rule
        assert rule["record"] in rules_text, f"{rule['record']} is used by no rule"
        # Two copies of a parameter (a Prometheus and a ruler with other external labels) must not break a join.
        assert f"group_left {rule['record']}" not in rules_text, f"{rule['record']}: join max() of it"
        assert f"`{rule['record']}`" in docs, f"{rule['record']} is not documented in docs/deploy.md"
    groups = load_yaml(JOB_RULES)["groups"]
    # Parameters first: the alerts of a later group read this evaluation's values.
    assert groups[0]["name"] == "jaxmon-job-parameters"
    assert all(r["record"].startswith("jaxmon:param:") for r in groups[0]["rules"])


def test_job_alerts_name_the_process_or_device_and_have_tests_both_ways() -> None:
    rules = {r["alert"]: r for r in alert_rules(JOB_RULES)}
    assert set(rules) == JOB_ALERTS
    fires: dict[str, list[set[str]]] = {}
    quiet: set[str] = set()
    for case in load_yaml(JOB_RULE_TESTS)["tests"]:
        for check in case.get("alert_rule_test", []):
            if check["exp_alerts"]:
                fires.setdefault(check["alertname"], []).extend(set(a["exp_labels"]) for a in check["exp_alerts"])
            else:
                quiet.add(check["alertname"])
    # job_test.yml loads alerts.yml beside job.yml: JaxmonTrainingStalled must stay quiet where
    # JaxmonTrainingProcessStalled names the culprit (one stall, one page).
    assert set(fires) == JOB_ALERTS and quiet == JOB_ALERTS | {"JaxmonTrainingStalled"}
    assert load_yaml(JOB_RULE_TESTS)["rule_files"] == ["job.yml", "alerts.yml"]
    for name, label_sets in fires.items():
        for labels in label_sets:
            assert labels >= NAMES_A_PROCESS or labels >= NAMES_A_DEVICE or labels >= NAMES_AN_AXIS, (name, labels)
    for name, rule in rules.items():
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, name
        # Every alert's runbook (docs/alerts.md) tells where its threshold is set: tests/unit/test_alert_runbooks.py.
        assert set(rule["annotations"]) == {"summary", "description", "runbook_url"}, name


def test_job_dashboard_variables() -> None:
    d = dashboard(JOB_DASHBOARD)
    assert d["uid"] == "jaxmon-job" and "__inputs" not in d
    variables = {v["name"]: v for v in dashboard_variables(JOB_DASHBOARD)}
    assert list(variables) == ["datasource", "workload", "k"]
    # One job at a time: medians and scores are per workload, and "All" would mix jobs.
    workload = variables["workload"]
    assert workload["type"] == "query" and not workload["multi"] and not workload["includeAll"]
    assert variables["k"]["type"] == "custom"
    assert [o["value"] for o in variables["k"]["options"]] == variables["k"]["query"].split(",")
    assert all(v.isdigit() for v in variables["k"]["query"].split(","))


# A query that returns one series per process or device must be cut to the k worst. These return one series (or
# one per bucket) whatever the job's size: aggregations, and the records aggregated `by (workload)`.
PER_WORKLOAD = "|".join(
    (
        "jaxmon:training_step_seconds:job_median5m",
        "jaxmon:training_host_wait_ratio:job_median5m",
        "jaxmon:workload_energy_joules_per_step:rate5m",
    )
)


def test_the_per_workload_records_are_aggregated_by_workload() -> None:
    exprs = {r["record"]: r["expr"] for r in recording_rules()}
    for name in PER_WORKLOAD.split("|"):
        assert re.match(r"\s*(quantile|sum) by \(workload\)", exprs[name]), name


def test_job_dashboard_stays_bounded_at_any_job_size() -> None:
    for title, ref, expr in dashboard_targets(JOB_DASHBOARD):
        # tests/dashboard_bounds.py's reading of the PromQL: topk/bottomk($k), an aggregate not by device or
        # process, or a per-workload record (what test_deploy holds every dashboard to).
        why = unbounded(expr)
        assert not why, f"{title} {ref}: {expr!r} returns a series per process or device ({why}); use topk/bottomk"
        for name in metric_tokens(expr) | record_tokens(expr):
            if name == "ALERTS":
                continue
            for selector in re.findall(rf"{re.escape(name)}(\{{[^}}]*\}})?", expr):
                assert 'workload="$workload"' in selector, (title, ref, name)


def test_job_dashboard_panels_have_units_and_fit_the_grid() -> None:
    occupied: set[tuple[int, int]] = set()
    for p in dashboard(JOB_DASHBOARD)["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        cells = {(g["x"] + dx, g["y"] + dy) for dx in range(g["w"]) for dy in range(g["h"])}
        assert not cells & occupied, f"{p['title']} overlaps another panel"
        occupied |= cells
    panels = dashboard_panels(JOB_DASHBOARD)
    assert len(panels) >= 10
    for p in panels:
        assert p["fieldConfig"]["defaults"].get("unit"), p["title"]
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        if p["type"] == "heatmap":
            assert all(t["format"] == "heatmap" and "sum by (le)" in t["expr"] for t in p["targets"]), p["title"]
    # Every per-process and per-device signal of the job rules has a panel.
    used = set().union(*(record_tokens(t[2]) for t in dashboard_targets(JOB_DASHBOARD)))
    for wanted in (
        "jaxmon:training_host_score",
        "jaxmon:training_host_wait_ratio:rate5m",
        "jaxmon:training_step_seconds:mean5m",
        "jaxmon:device_speed:relative",
        "jaxmon:workload_device_memory_bytes:relative",
    ):
        assert wanted in used, wanted


def test_the_docs_list_the_job_dashboard_panels() -> None:
    docs = DOCS.read_text(encoding="utf-8")
    section = docs[docs.index("### The Job dashboard") :]
    for p in dashboard_panels(JOB_DASHBOARD):
        assert f"| {p['title']} |" in section, p["title"]
