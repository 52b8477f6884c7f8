"""The panel DSL the dashboard rows are written in: Target, Panel, Row, and the selectors and mappings they share."""

from __future__ import annotations

from dataclasses import dataclass, field

# Label selectors shared by the panels. `$workload` is left out of probe panels on purpose: a sidecar's probe
# series carry no workload label (the probe measures the device, not a process), so filtering them by workload
# would hide them; in embedded mode the workload label is there and "All" shows it.
INST = 'job=~"$job", instance=~"$instance"'
DEV = INST + ', platform=~"$platform", device=~"$device"'
MEM = DEV + ', workload=~"$workload"'
WL = INST + ', workload=~"$workload"'

DEVICE_LEGEND = "{{instance}} {{platform}}:{{device}} {{workload}}"
# Device-wide series (NVML, libtpu) carry the source that read them.
WIDE_LEGEND = "{{instance}} {{platform}}:{{device}} ({{source}})"


@dataclass
class Target:
    """One query of a panel."""

    expr: str
    legend: str = DEVICE_LEGEND
    table: bool = False  # an instant query rendered as a table (identity metrics)


@dataclass
class Panel:
    """One dashboard panel: its kind, unit and queries."""

    title: str
    kind: str  # timeseries, stat, state-timeline, table, bargauge, heatmap
    unit: str
    targets: list[Target]
    description: str = ""
    width: int = 12
    height: int = 8
    min: float | None = None
    max: float | None = None
    thresholds: list[tuple[float, str]] = field(default_factory=list)
    mappings: dict[str, tuple[str, str]] = field(default_factory=dict)  # value -> (text, colour)
    stack: bool = False  # a stacked area (timeseries): shares that add up


@dataclass
class Row:
    """A titled group of panels."""

    title: str
    panels: list[Panel]


UP_MAPPING = {"1": ("up", "green"), "0": ("down", "red")}
YES_NO_MAPPING = {"1": ("yes", "green"), "0": ("no", "red")}
OK_MAPPING = {"1": ("ok", "green"), "0": ("failing", "red")}


def rate(metric: str, selector: str) -> str:
    """The per-second rate of a counter over Grafana's rate interval."""
    return f"rate({metric}{{{selector}}}[$__rate_interval])"


def increase(metric: str, selector: str) -> str:
    """The increase of a counter over Grafana's rate interval."""
    return f"increase({metric}{{{selector}}}[$__rate_interval])"


def top(expr: str) -> str:
    """The `$k` series of `expr` with the highest values: a panel that can draw one line per device or process
    draws `$k` (tests/unit/test_deploy.py holds every dashboard query to a bound)."""
    return f"topk($k, {expr})"


def bottom(expr: str) -> str:
    """The `$k` series of `expr` with the lowest values."""
    return f"bottomk($k, {expr})"


def exporters_up(width: int) -> Panel:
    """The count of jaxmon targets up: the first stat of the main and the fleet dashboards."""
    return Panel(
        "Exporters up",
        "stat",
        "none",
        [Target(f"sum(up{{{INST}}})", "up")],
        "jaxmon targets Prometheus scrapes successfully.",
        width=width,
        height=4,
    )
