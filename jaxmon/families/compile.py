"""The compile counter families: rendered for an embedded workload (compile collector) and spooled workloads."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client.core import Metric

from jaxmon.families import Spec, add

# (family, key in the counters)
COMPILE_METRICS = (
    (
        Spec(
            "jaxmon_jit_compilations",
            "XLA backend compilations in the workload (persistent-cache loads too).",
            counter=True,
        ),
        "compilations",
    ),
    (
        Spec("jaxmon_jit_compile_seconds", "Seconds spent in XLA backend compilation in the workload.", counter=True),
        "compile_seconds",
    ),
    (
        Spec(
            "jaxmon_compilation_cache_hits",
            "Compilations in the workload that the persistent compilation cache answered (JAX's cache_hits).",
            True,
        ),
        "cache_hits",
    ),
    (
        Spec(
            "jaxmon_compilation_cache_misses",
            "Compilations in the workload that looked in the persistent compilation cache and found nothing "
            "(JAX's compile_requests_use_cache - cache_hits), whether or not the result was then written "
            "(jax_persistent_cache_min_compile_time_secs, ..._min_entry_size_bytes).",
            True,
        ),
        "cache_misses",
    ),
)


def compile_families(rows: list[tuple[dict[str, str], Mapping[str, float]]]) -> Iterator[Metric]:
    """The compile counter families of (labels, counters) rows."""
    families = {key: spec.new() for spec, key in COMPILE_METRICS}
    for labels, counters in rows:
        for key, fam in families.items():
            add(fam, labels, float(counters.get(key, 0.0)))
    yield from families.values()
