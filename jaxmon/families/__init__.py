"""Metric families: the helpers every collector renders with, and the table of families several collectors share.

`shared` holds the name and HELP of every family that more than one collector renders (the exposition merges
their samples into one family); `memory` and `compile` render the allocator and compile families for both this
process's devices and spooled workloads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from prometheus_client.core import Metric
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

# The value format of generate_latest (Go's float formatting: 1.0, 2.147483648e+10, +Inf, NaN); untyped upstream.
go_float = cast(Callable[[float], str], floatToGoString)


@dataclass(frozen=True)
class Spec:
    """A family's name (without `_total`), HELP and type."""

    name: str
    help: str
    counter: bool = False

    def new(self) -> Metric:
        """A fresh, empty family."""
        return family(self.name, self.help, self.counter)


def family(name: str, help_text: str, counter: bool = False) -> Metric:
    """An empty gauge or counter family (`name` without `_total`)."""
    return Metric(name, help_text, "counter" if counter else "gauge")


def sample_name(fam: Metric) -> str:
    """The name samples of `fam` carry (`_total` for counters)."""
    return fam.name + ("_total" if fam.type == "counter" else "")


def add(fam: Metric, labels: dict[str, str], value: float) -> None:
    """Append one sample."""
    fam.samples.append(Sample(sample_name(fam), labels, float(value)))
