"""Grafana dashboards from rows of panels: the templating variables, the panel layout and each panel's JSON."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .panels import INST, Panel, Row
from .paths import ROOT
from .rows import (
    devicewide,
    fleet,
    health,
    hosts,
    jax_training,
    job,
    ladder,
    links,
    megascale,
    memory,
    overview,
    probe,
    tpu_ladder,
    training,
    workloads,
)

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}

DEVICES = '__name__=~"jaxmon_device_info|jaxmon_device_source_up"'


def _variable(name: str, label: str, query: str, all_value: str | None = None, *, multi: bool = True) -> dict[str, Any]:
    """A query variable over `query`, refreshed with the time range: multi-valued with "All" selected, or (not
    `multi`) one value, the first."""
    variable: dict[str, Any] = {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DATASOURCE,
        "definition": query,
        "query": {"query": query, "refId": "StandardVariableQuery"},
        "refresh": 2,
        "includeAll": True,
        "multi": True,
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "options": [],
        "regex": "",
        "sort": 1,
        "hide": 0,
    }
    if all_value is not None:
        # Without it, "All" is the alternation of the listed values (Grafana's default).
        variable["allValue"] = all_value
    if not multi:
        variable.update({"includeAll": False, "multi": False, "current": {}})
    return variable


DATASOURCE_VARIABLE = {
    "name": "datasource",
    "label": "Data source",
    "type": "datasource",
    "query": "prometheus",
    "current": {},
    "options": [],
    "refresh": 1,
    "regex": "",
    "hide": 0,
}


# How many of the worst processes, devices or GPUs a panel lists (topk / bottomk), on both dashboards.
K_VARIABLE: dict[str, Any] = {
    "name": "k",
    "label": "Show the worst",
    "type": "custom",
    "query": "5,10,20,50",
    "current": {"selected": True, "text": "10", "value": "10"},
    "options": [{"selected": value == "10", "text": value, "value": value} for value in ("5", "10", "20", "50")],
    "multi": False,
    "includeAll": False,
    "hide": 0,
}


def templating() -> list[dict[str, Any]]:
    """The dashboard's variables: data source, then job, instance, platform, device and workload, chained; and k."""
    return [
        DATASOURCE_VARIABLE,
        _variable("job", "Job", "label_values(jaxmon_build_info, job)"),
        # From `up`, so that an exporter that is down still shows (and counts) as a host.
        _variable("instance", "Host (instance)", 'label_values(up{job=~"$job"}, instance)'),
        # Devices JAX sees (jaxmon_device_info) and devices only a device-wide source sees (a TPU held by the
        # trainer, read through libtpu; a GPU through NVML): jaxmon_device_source_up.
        _variable("platform", "Platform", f"label_values({{{DEVICES}, {INST}}}, platform)"),
        _variable(
            "device",
            "Device",
            f'label_values({{{DEVICES}, {INST}, platform=~"$platform"}}, device)',
        ),
        # All = ".*", which also matches series without the label: a sidecar's own devices have no workload.
        _variable("workload", "Workload", f"label_values(jaxmon_device_info{{{INST}}}, workload)", all_value=".*"),
        K_VARIABLE,
    ]


def job_templating() -> list[dict[str, Any]]:
    """The Job dashboard's variables: data source, the one workload (a job) it shows, and k, how many of the worst
    processes or devices each panel lists."""
    return [
        DATASOURCE_VARIABLE,
        _variable(
            "workload",
            "Workload (job)",
            "label_values(jaxmon_training_last_step_timestamp_seconds, workload)",
            multi=False,
        ),
        K_VARIABLE,
    ]


def fleet_templating() -> list[dict[str, Any]]:
    """The fleet dashboard's variables: the main dashboard's job, instance, platform and device, then namespace and
    pod (of the kubelet's assignments; "All" also keeps the devices no pod holds), and k."""
    pods = f"jaxmon_kubernetes_pod_device_info{{{INST}}}"
    return [
        *[v for v in templating() if v["name"] != "workload" and v is not K_VARIABLE],
        _variable("namespace", "Namespace", f"label_values({pods}, namespace)", all_value=".*"),
        _variable(
            "pod",
            "Pod",
            f'label_values(jaxmon_kubernetes_pod_device_info{{{INST}, namespace=~"$namespace"}}, pod)',
            all_value=".*",
        ),
        K_VARIABLE,
    ]


def _panel_json(p: Panel, panel_id: int, x: int, y: int) -> dict[str, Any]:
    """One panel's JSON at (x, y): field defaults, queries, and the options of its kind."""
    defaults: dict[str, Any] = {"unit": p.unit}
    if p.min is not None:
        defaults["min"] = p.min
    if p.max is not None:
        defaults["max"] = p.max
    steps = p.thresholds or [(0, "green")]
    defaults["thresholds"] = {
        "mode": "absolute",
        "steps": [{"color": colour, "value": None if i == 0 else value} for i, (value, colour) in enumerate(steps)],
    }
    if p.mappings:
        defaults["mappings"] = [
            {
                "type": "value",
                "options": {
                    value: {"text": text, "color": colour, "index": i}
                    for i, (value, (text, colour)) in enumerate(p.mappings.items())
                },
            }
        ]
    if p.kind in ("timeseries",):
        defaults["custom"] = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 0, "showPoints": "never"}
        if p.stack:
            defaults["custom"].update({"fillOpacity": 60, "stacking": {"mode": "normal", "group": "A"}})
    targets = []
    for i, t in enumerate(p.targets):
        target: dict[str, Any] = {
            "refId": chr(ord("A") + i),
            "datasource": DATASOURCE,
            "expr": t.expr,
            "legendFormat": "__auto" if t.table else t.legend,
        }
        if t.table:
            target.update({"format": "table", "instant": True, "range": False})
        elif p.kind == "heatmap":
            target.update({"format": "heatmap", "instant": False, "range": True})
        elif p.kind in ("stat", "bargauge"):
            target.update({"instant": True, "range": False})
        else:
            target.update({"instant": False, "range": True})
        targets.append(target)
    panel: dict[str, Any] = {
        "id": panel_id,
        "type": p.kind,
        "title": p.title,
        "description": p.description,
        "datasource": DATASOURCE,
        "gridPos": {"h": p.height, "w": p.width, "x": x, "y": y},
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "targets": targets,
    }
    if p.kind == "timeseries":
        panel["options"] = {
            "legend": {"displayMode": "table", "placement": "bottom", "showLegend": True, "calcs": ["lastNotNull"]},
            "tooltip": {"mode": "multi", "sort": "desc"},
        }
    elif p.kind == "stat":
        panel["options"] = {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "value",
            "graphMode": "none",
            "textMode": "auto",
        }
    elif p.kind == "bargauge":
        panel["options"] = {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "displayMode": "basic",
            "orientation": "horizontal",
        }
    elif p.kind == "heatmap":
        # The series are already buckets (format: heatmap turns cumulative `le` buckets into counts per bucket).
        panel["options"] = {
            "calculate": False,
            "yAxis": {"unit": p.unit, "axisPlacement": "left"},
            "cellGap": 1,
            "color": {"mode": "scheme", "scheme": "Oranges", "steps": 64},
            "tooltip": {"show": True, "yHistogram": True},
            "legend": {"show": True},
        }
    elif p.kind == "state-timeline":
        panel["options"] = {"mergeValues": True, "showValue": "auto", "legend": {"showLegend": False}}
    elif p.kind == "table":
        panel["options"] = {"showHeader": True}
        panel["transformations"] = [
            {"id": "organize", "options": {"excludeByName": {"Time": True, "Value": True, "__name__": True}}}
        ]
    return panel


@dataclass
class Dashboard:
    """A generated dashboard file: what Grafana knows it by, its variables and its rows, top to bottom."""

    file: Path
    uid: str
    title: str
    description: str
    tags: list[str]
    rows: list[Row]
    variables: list[dict[str, Any]] = field(default_factory=templating)
    # Other dashboards to link to from the top bar: (title, uid).
    links: list[tuple[str, str]] = field(default_factory=list)


def layout(rows: list[Row]) -> list[dict[str, Any]]:
    """The panels laid out left to right, top to bottom, a row header before each group."""
    panels: list[dict[str, Any]] = []
    panel_id = 1
    y = 0
    for row in rows:
        panels.append(
            {
                "id": panel_id,
                "type": "row",
                "title": row.title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                "panels": [],
            }
        )
        panel_id += 1
        y += 1
        x = 0
        line_height = 0
        for p in row.panels:
            if x + p.width > 24:
                x, y, line_height = 0, y + line_height, 0
            panels.append(_panel_json(p, panel_id, x, y))
            panel_id += 1
            x += p.width
            line_height = max(line_height, p.height)
        y += line_height
    return panels


def dashboard_json(d: Dashboard) -> dict[str, Any]:
    """The whole dashboard, as Grafana provisions it from a file."""
    return {
        "uid": d.uid,
        "title": d.title,
        "description": d.description,
        "tags": d.tags,
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-3h", "to": "now"},
        "timepicker": {},
        "timezone": "browser",
        "links": [
            {"title": title, "type": "link", "url": f"/d/{uid}", "keepTime": True, "icon": "dashboard"}
            for title, uid in d.links
        ],
        "annotations": {
            "list": [
                {
                    "builtIn": 1,
                    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                    "enable": True,
                    "hide": True,
                    "iconColor": "rgba(0, 211, 255, 1)",
                    "name": "Annotations & Alerts",
                    "type": "dashboard",
                }
            ]
        },
        "templating": {"list": d.variables},
        "panels": layout(d.rows),
    }


def dashboard_text(d: Dashboard) -> str:
    """The dashboard as committed: two-space indent, trailing newline."""
    return json.dumps(dashboard_json(d), indent=2) + "\n"


JAXMON = Dashboard(
    file=ROOT / "grafana" / "dashboards" / "jaxmon.json",
    uid="jaxmon",
    title="jaxmon: JAX accelerators",
    description="Memory, fragmentation, OOM headroom, utilization estimate, device health and compilation "
    "of JAX accelerators, from jaxmon (a Prometheus exporter). A panel that could draw a line per device or "
    "process shows the $k highest (or lowest, where low is bad) or an aggregate.",
    tags=["jaxmon", "jax", "accelerators"],
    rows=[
        overview.ROW,
        training.ROW,
        links.MAIN,
        memory.ROW,
        probe.ROW,
        devicewide.ROW,
        ladder.ROW,
        tpu_ladder.ROW,
        megascale.ROW,
        workloads.ROW,
        hosts.ROW,
        health.ROW,
    ],
    links=[
        ("JAX training", "jaxmon-training"),
        ("GPU and TPU fleet", "jaxmon-fleet"),
        ("Training job (stragglers, skew)", "jaxmon-job"),
    ],
)

JOB = Dashboard(
    file=ROOT / "grafana" / "dashboards" / "jaxmon-job.json",
    uid="jaxmon-job",
    title="jaxmon: training job",
    description="One training job (a workload) across its processes and devices: stragglers, stalled processes, "
    "slow devices and memory skew, from the recording rules of deploy/prometheus/job.yml. Panels show the $k "
    "worst, so the dashboard reads the same at 4 processes as at 4,096.",
    tags=["jaxmon", "jax", "training"],
    rows=job.ROWS,
    variables=job_templating(),
    links=[("JAX training", "jaxmon-training"), ("Devices (jaxmon)", "jaxmon")],
)

TRAINING = Dashboard(
    file=ROOT / "grafana" / "dashboards" / "jaxmon-training.json",
    uid="jaxmon-training",
    title="jaxmon: JAX training",
    description="For the ML engineer: one training job (a workload) as a whole, its step time, tokens/s, MFU, "
    "goodput and badput, compilation, and its $k worst processes and devices (stragglers from the recording rules "
    "of deploy/prometheus/job.yml, memory headroom).",
    tags=["jaxmon", "jax", "training"],
    rows=jax_training.ROWS,
    variables=job_templating(),
    links=[("Training job (stragglers, skew)", "jaxmon-job"), ("GPU and TPU fleet", "jaxmon-fleet")],
)

FLEET = Dashboard(
    file=ROOT / "grafana" / "dashboards" / "jaxmon-fleet.json",
    uid="jaxmon-fleet",
    title="jaxmon: GPU and TPU fleet",
    description="For the SRE: the health, memory, duty cycle and utilization ladder of every accelerator jaxmon "
    "sees, and the pods that hold them; counts over the fleet and its $k worst devices.",
    tags=["jaxmon", "accelerators", "fleet"],
    rows=fleet.ROWS,
    variables=fleet_templating(),
    links=[("Devices (jaxmon)", "jaxmon"), ("JAX training", "jaxmon-training")],
)

# Every generated dashboard; another (its own file, uid and rows) is one more entry.
DASHBOARDS = [JAXMON, JOB, TRAINING, FLEET]


def outputs() -> dict[Path, str]:
    """Each dashboard file and its expected content."""
    return {d.file: dashboard_text(d) for d in DASHBOARDS}
