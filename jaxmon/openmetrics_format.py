"""The OpenMetrics exposition, served where the scraper asks for it (`Accept: application/openmetrics-text`, as
Prometheus' default scrape does), with `_created` on the training counters and histograms, as client_python writes
it for its own.

`x_created` is the Unix time the counter started from 0: for every training counter and the step histogram of a
process, that process's tracker start (metrics.TRAINING_START_TIME_SECONDS of the same workload, process_index,
process_count and host: every counter jaxmon's training series hold counts from there, a kind or a device born later
included, as it was 0 until then). A Prometheus that reads created timestamps sees each restart's first increase
whole. Other counters carry none (OpenMetrics makes it optional): they count from their exporter's start
(`process_start_time_seconds`). The text format (0.0.4) is unchanged: no `_created` there.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client.core import Metric
from prometheus_client.openmetrics.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from jaxmon.catalog import metrics

__all__ = ["CONTENT_TYPE_LATEST", "render", "wants_openmetrics", "with_created"]

START = metrics.TRAINING_START_TIME_SECONDS.name
# The training counters and histogram, which count from their process's start.
FROM_START = frozenset(
    f.name for f in metrics.FAMILIES if "training" in f.collectors and f.type in (metrics.COUNTER, metrics.HISTOGRAM)
)
PROCESS = ("workload", "process_index", "process_count", "host")  # the labels every training series has
EOF = b"# EOF\n"


def wants_openmetrics(accept: str) -> bool:
    """Whether an Accept header asks for OpenMetrics (as prometheus_client's `choose_encoder` reads it)."""
    return any(part.split(";")[0].strip() == "application/openmetrics-text" for part in accept.split(","))


def _process(labels: dict[str, str]) -> tuple[str | None, ...]:
    return tuple(labels.get(k) for k in PROCESS)


def with_created(families: list[Metric]) -> list[Metric]:
    """`families` with an `x_created` sample after each label set of every training counter and histogram whose
    process's start time is among them (new Metric objects for those; the others as they are)."""
    starts = {_process(s.labels): s.value for f in families if f.name == START for s in f.samples}
    if not starts:
        return families
    out = []
    for fam in families:
        if fam.name not in FROM_START:
            out.append(fam)
            continue
        created = Metric(fam.name, fam.documentation, fam.type, fam.unit)
        groups: dict[tuple[tuple[str, str], ...], list[Sample]] = {}
        for s in fam.samples:  # a histogram's buckets, count and sum of one label set together, in their order
            groups.setdefault(tuple((k, v) for k, v in s.labels.items() if k != "le"), []).append(s)
        for key, samples in groups.items():
            created.samples.extend(samples)
            labels = dict(key)
            start = starts.get(_process(labels))
            if start is not None:
                created.samples.append(Sample(fam.name + "_created", labels, start))
        out.append(created)
    return out


class _Families(Collector):
    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def render(families: Iterable[Metric], last: bool) -> bytes:
    """`families` in OpenMetrics; `# EOF` only when `last` (the exposition ends with another part). Raises
    ValueError for what OpenMetrics cannot carry and some client_python versions write anyway (0.23.1 writes a
    gauge's exemplar): the caller serves the text format instead."""
    families = list(families)
    for family in families:
        if family.type not in ("counter", "histogram", "gaugehistogram") and any(
            getattr(sample, "exemplar", None) for sample in family.samples
        ):
            raise ValueError(f"{family.name}: OpenMetrics allows exemplars on counters and histograms only")
    text = bytes(generate_latest(_Families(families)))  # type: ignore[no-untyped-call]
    return text if last else text.removesuffix(EOF)
