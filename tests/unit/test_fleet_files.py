"""The fleet tier's files read in-process: deploy/prometheus/fleet.yml against docs/scale.md, job.yml and the
metrics reference. promtool runs fleet_test.yml in tests/e2e/test_deploy.py; tests/e2e/test_fleet_tier.py sends the
records through a Prometheus agent to a receiver."""

from __future__ import annotations

import re

from tests.deploy_files import (
    FLEET_RULES,
    PROMETHEUS_DIR,
    load_yaml,
    metric_tokens,
    readme_metrics,
    record_tokens,
    recording_rules,
)
from tests.helpers import ROOT

SCALE = ROOT / "docs" / "scale.md"
# What the fleet tier keeps: the remote_write's write_relabel_configs of docs/scale.md.
KEEP = "jaxmon:fleet_.+"
# fleet.yml's own intermediate records, which stay in the slice's Prometheus.
INTERMEDIATE = {"jaxmon:training_model_flops_utilization_ratio:process_avg"}
# The labels a fleet record may keep: the job, and what splits its few series (the straggler names its process).
PER_JOB = {"workload", "kind", "le", "alertname", "severity"}
STRAGGLER = {"workload", "alertname", "process_index", "host", "instance", "device"}


def fleet_records() -> dict[str, list[str]]:
    """Each record fleet.yml sends on, and its expressions (one per rule that records it)."""
    out: dict[str, list[str]] = {}
    for rule in recording_rules(FLEET_RULES):
        if rule["record"] not in INTERMEDIATE:
            out.setdefault(rule["record"], []).append(rule["expr"])
    return out


def test_what_the_fleet_keeps_is_exactly_the_fleet_records() -> None:
    fleet = set(fleet_records())
    assert fleet and all(re.fullmatch(KEEP, name) for name in fleet), fleet
    assert all(re.fullmatch(r"jaxmon:fleet_[a-z0-9_]+:[a-z0-9_]+", name) for name in fleet), fleet
    others = {r["record"] for r in recording_rules()} | INTERMEDIATE
    assert not [name for name in others if re.fullmatch(KEEP, name)]
    assert {r["record"] for r in recording_rules(FLEET_RULES)} - set(fleet) == INTERMEDIATE


def test_each_fleet_record_is_per_job_with_no_process_or_device_label_but_the_stragglers() -> None:
    for name, exprs in fleet_records().items():
        for expr in exprs:
            assert " without " not in expr and "without(" not in expr, name
            if expr.startswith("histogram_quantile("):  # of a fleet record, itself per job
                assert record_tokens(expr) <= set(fleet_records()), name
                continue
            # The outermost aggregation (a topk by job over one) keeps only per-job labels.
            outer = re.match(r"\s*(\w+) by \(([^)]*)\)", expr)
            assert outer, f"{name}: not an aggregation by the job: {expr}"
            labels = {label.strip() for label in outer.group(2).split(",")}
            allowed = STRAGGLER if name == "jaxmon:fleet_straggler:firing" else PER_JOB
            assert "workload" in labels and labels <= allowed, (name, labels)


def test_the_fleet_rules_read_only_series_that_exist() -> None:
    text = FLEET_RULES.read_text(encoding="utf-8") + (PROMETHEUS_DIR / "fleet_test.yml").read_text(encoding="utf-8")
    assert metric_tokens(text) - set(readme_metrics()) == set()
    recorded = {r["record"] for r in recording_rules()} | {r["record"] for r in recording_rules(FLEET_RULES)}
    assert record_tokens(text) - recorded - {"jaxmon:fleet_"} == set()  # the comments' jaxmon:fleet_<what>
    # Each group reads the device or process series of every job at most once (the expensive reads: Prometheus
    # evaluates groups side by side), and the quantiles read records.
    groups = load_yaml(FLEET_RULES)["groups"]
    assert [g["name"] for g in groups][:2] == ["jaxmon-fleet-process-mfu", "jaxmon-fleet-step-buckets"]


def test_docs_scale_lists_every_fleet_record_and_the_relabeling_that_keeps_them() -> None:
    text = SCALE.read_text(encoding="utf-8")
    rows = [line.split("|")[1] for line in text.splitlines() if line.startswith("| `jaxmon:fleet_")]
    assert set().union(*(record_tokens(row) for row in rows)) == set(fleet_records())
    assert f"regex: {KEEP}" in text and "action: keep" in text
