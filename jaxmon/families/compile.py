"""The compile counter families: rendered for an embedded workload (compile collector) and spooled workloads."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client.core import Metric

from jaxmon.catalog import metrics
from jaxmon.families import add

# (family, key in the counters)
COMPILE_METRICS = (
    (metrics.JIT_COMPILATIONS, "compilations"),
    (metrics.JIT_COMPILE_SECONDS, "compile_seconds"),
    (metrics.COMPILATION_CACHE_HITS, "cache_hits"),
    (metrics.COMPILATION_CACHE_MISSES, "cache_misses"),
)


def compile_families(rows: list[tuple[dict[str, str], Mapping[str, float]]]) -> Iterator[Metric]:
    """The compile counter families of (labels, counters) rows."""
    families = {key: spec.new() for spec, key in COMPILE_METRICS}
    for labels, counters in rows:
        for key, fam in families.items():
            add(fam, labels, float(counters.get(key, 0.0)))
    yield from families.values()
