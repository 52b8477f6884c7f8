"""The compile collector: XLA compilations and persistent-cache hits/misses of the workload process itself.

Only inside a workload (embedded `jaxmon.start()`); spooled workloads' counters come with the spool collector.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from prometheus_client.core import Metric
from pydantic import Field

from jaxmon.births import for_process
from jaxmon.collectors import register
from jaxmon.collectors.base import Collector, Context, Update
from jaxmon.families.compile import compile_families
from jaxmon.settings import CollectorOptions, Enabled
from jaxmon.snapshot import Snapshot


@dataclass(frozen=True)
class CompileState:
    """The workload process's compile counters since jaxmon started listening."""

    process_index: int
    counters: Mapping[str, float]


class CompileOptions(CollectorOptions):
    """`--collector.compile`: on inside a workload process (embedded), off in a daemon."""

    enabled: Enabled = Field(
        default="auto", description="true, false, or auto (on inside a workload process: jaxmon.start())."
    )


@register
class CompileCollector(Collector[CompileOptions, CompileState]):
    """jax.monitoring compile events of this process."""

    name = "compile"
    description = "XLA compilations and persistent compilation cache hits/misses of the workload process."
    options = CompileOptions
    order = 30

    @classmethod
    def unavailable(cls, opts: CompileOptions, ctx: Context) -> str | None:
        """Only a workload process has compilations of its own to count."""
        return ctx.not_in_workload()

    def __init__(self, opts: CompileOptions, ctx: Context) -> None:
        super().__init__(opts, ctx)
        # The process's: its counters count on through a stop() and a start() (jaxmon.births.for_process).
        self._births = for_process(self.name)
        self._unheld: tuple[CompileState | None, CompileState | None] = (None, None)  # the last state, and unheld

    def update(self) -> Update[CompileState]:
        """The counters now, at 0 until a scrape has served them (jaxmon.births: a restart is a reset)."""
        in_process = self.ctx.in_process
        assert in_process is not None  # unavailable() otherwise
        self._births.begin()
        try:
            key = (self.ctx.workload or "", in_process.process_index)
            counts = in_process.compile_counts()
            state = CompileState(in_process.process_index, self._births.compile(key, counts))
        finally:
            self._births.end()
        self._unheld = (state, CompileState(in_process.process_index, counts))
        return Update(state)

    def unheld(self, state: CompileState) -> CompileState:
        """The counters at their values (what readers other than Prometheus are served)."""
        held, values = self._unheld
        return values if state is held and values is not None else state

    def families(self, snap: Snapshot, state: CompileState) -> Iterator[Metric]:
        """One series per counter, labelled with the workload and its process index."""
        labels = {"workload": self.ctx.workload or "", "process_index": str(state.process_index)}
        return compile_families([(labels, state.counters)])
