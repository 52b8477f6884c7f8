"""The compile collector: XLA compilations and persistent-cache hits/misses of the workload process itself.

Only inside a workload (embedded `jaxmon.start()`); spooled workloads' counters come with the spool collector.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from prometheus_client.core import Metric

from jaxmon.collectors import register
from jaxmon.collectors.base import Collector, CollectorOptions, Context, Enabled, Update, add, family
from jaxmon.snapshot import Snapshot

COMPILE_METRICS = (
    (
        "jaxmon_jit_compilations",
        "compilations",
        "XLA backend compilations in the workload (persistent-cache loads too).",
    ),
    ("jaxmon_jit_compile_seconds", "compile_seconds", "Seconds spent in XLA backend compilation in the workload."),
    ("jaxmon_compilation_cache_hits", "cache_hits", "Persistent compilation cache hits in the workload."),
    ("jaxmon_compilation_cache_misses", "cache_misses", "Persistent compilation cache misses (entries written)."),
)


def compile_families(rows: list[tuple[dict[str, str], Mapping[str, float]]]) -> Iterator[Metric]:
    """The compile counter families of (labels, counters) rows."""
    families = {key: family(name, help_text, counter=True) for name, key, help_text in COMPILE_METRICS}
    for labels, counters in rows:
        for key, fam in families.items():
            add(fam, labels, float(counters.get(key, 0.0)))
    yield from families.values()


@dataclass(frozen=True)
class CompileState:
    """The workload process's compile counters since jaxmon started listening."""

    process_index: int
    counters: Mapping[str, float]


class CompileOptions(CollectorOptions):
    """`--collector.compile`: on inside a workload process (embedded), off in a daemon."""

    enabled: Enabled = "auto"


@register
class CompileCollector(Collector[CompileState]):
    """jax.monitoring compile events of this process."""

    name = "compile"
    description = "XLA compilations and persistent compilation cache hits/misses of the workload process."
    options = CompileOptions
    order = 30

    @classmethod
    def unavailable(cls, ctx: Context) -> str | None:
        """Only a workload process has compilations of its own to count."""
        return None if ctx.in_process is not None and ctx.workload is not None else "not inside a workload process"

    def update(self) -> Update[CompileState]:
        """The counters now."""
        in_process = self.ctx.in_process
        assert in_process is not None  # unavailable() otherwise
        return Update(CompileState(in_process.process_index, in_process.compile_counts()))

    def families(self, snap: Snapshot, state: CompileState) -> Iterator[Metric]:
        """One series per counter, labelled with the workload and its process index."""
        labels = {"workload": self.ctx.workload or "", "process_index": str(state.process_index)}
        return compile_families([(labels, state.counters)])
