"""Metric families: the helpers collectors render with, and the renderers of families several collectors share.

Every family is declared in the metric catalog (jaxmon.catalog.metrics) and rendered with its `new()`; `reference`
writes docs/metrics.md from it.

`memory`, `compile` and `training` render their families for both this process's devices and spooled workloads;
`nvml` and `libtpu` render the device-wide sources' families.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

from prometheus_client.core import Metric
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

# The value format of generate_latest (Go's float formatting: 1.0, 2.147483648e+10, +Inf, NaN); untyped upstream.
go_float = cast(Callable[[float], str], floatToGoString)


def sample_name(fam: Metric) -> str:
    """The name samples of `fam` carry (`_total` for counters)."""
    return fam.name + ("_total" if fam.type == "counter" else "")


def add(fam: Metric, labels: dict[str, str], value: float) -> None:
    """Append one sample."""
    fam.samples.append(Sample(sample_name(fam), labels, float(value)))
