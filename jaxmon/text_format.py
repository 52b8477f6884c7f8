"""The text format (0.0.4), as prometheus_client's `generate_latest` writes it, with its formatted label sets and values
kept from one render to the next (jaxmon.exposition renders every scrape with it)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client.core import Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.registry import Collector as PromCollector

from jaxmon.families import go_float


class _OneFamily(PromCollector):
    def __init__(self, family: Metric) -> None:
        self._family = family

    def collect(self) -> Iterator[Metric]:
        return iter((self._family,))


def _label_value(value: str) -> str:
    # prometheus_client escapes label values this way whatever the name escaping (openmetrics._escape, ALLOWUTF8).
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


class TextFormat:
    """Writes families in the text format (0.0.4): byte for byte what prometheus_client's `generate_latest` writes.

    generate_latest sorts, validates, escapes and joins the labels of every sample and formats every value anew on
    each call. The label sets of a device stay the same from one snapshot to the next, and many values (limits,
    pool sizes, flags, step counts) do too, so this keeps both formatted strings between calls. Each cache is
    bounded by twice the samples of the last call: past that (values that keep changing) it starts again.
    Families other than plain gauges and counters (timestamps, exemplars, OpenMetrics-only samples) go through
    generate_latest itself.
    """

    def __init__(self) -> None:
        self._labels: dict[tuple[tuple[str, str], ...], str] = {}
        self._values: dict[float, str] = {}

    def _label_string(self, labels: dict[str, str]) -> str:
        text = ",".join(f'{openmetrics.escape_label_name(k)}="{_label_value(v)}"' for k, v in sorted(labels.items()))
        return "{" + text + "}" if text else ""

    def render(self, families: Iterable[Metric]) -> bytes:
        """The exposition of `families`."""
        label_cache, value_cache = self._labels, self._values
        samples = 0
        out: list[str] = []
        append = out.append
        for fam in families:
            mtype = fam.type
            sample_name = fam.name + "_total" if mtype == "counter" else fam.name
            if mtype not in ("gauge", "counter"):
                append(generate_latest(_OneFamily(fam)).decode("utf-8"))
                continue
            start = len(out)
            name = openmetrics.escape_metric_name(sample_name)
            doc = fam.documentation.replace("\\", r"\\").replace("\n", r"\n")
            append(f"# HELP {name} {doc}\n# TYPE {name} {mtype}\n")
            for s in fam.samples:
                if s.name != sample_name or s.timestamp is not None or s.exemplar is not None or s.native_histogram:
                    del out[start:]  # not a plain sample: let generate_latest write the whole family
                    append(generate_latest(_OneFamily(fam)).decode("utf-8"))
                    break
                key = tuple(s.labels.items())
                labels = label_cache.get(key)
                if labels is None:
                    labels = label_cache[key] = self._label_string(s.labels)
                value = s.value
                # Equal numbers format alike (1 == 1.0 == True -> "1.0"), except 0.0 and -0.0: zeros are not
                # cached. NaN is not stored (it equals nothing).
                text = value_cache.get(value) if value else None
                if text is None:
                    text = go_float(value)
                    if value and value == value:
                        value_cache[value] = text
                append(f"{name}{labels} {text}\n")
            samples += len(fam.samples)
        bound = 2 * samples + 256
        if len(label_cache) > bound:
            label_cache.clear()
        if len(value_cache) > bound:
            value_cache.clear()
        return "".join(out).encode("utf-8")
