"""libtpu's `Metric` messages (tpu-info's generated protobuf classes) turned into numbers: device ids, gauges,
the HLO execution time of each device, and the megascale distributions of the host.

Pure functions of the messages: tests/unit/sources/test_libtpu.py builds the messages as libtpu sends them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from jaxmon.sources.libtpu.names import QUANTILES, HostDistribution

# tpu-info's label for an entry with no buffer size (get_transfer_latency).
NO_BUFFER_SIZE = "N/A"


@dataclass(frozen=True)
class Timing:
    """HLO execution time of one device, from libtpu's distribution: mean and quantiles, in seconds."""

    count: int
    mean_seconds: float
    quantiles: tuple[tuple[float, float], ...]


@dataclass(frozen=True)
class Summary:
    """One megascale distribution of the host (one buffer size of it, where it has them), in base units.

    libtpu's distributions are cumulative (since its start), so `count` and `total` (count x mean) only grow:
    Prometheus can take their rate. `quantiles` are over the whole distribution, empty before the first sample.
    """

    buffer_size: str | None
    count: int
    total: float
    quantiles: tuple[tuple[float, float], ...]


def gauges(metrics: Iterable[Any]) -> dict[int, float]:
    """device-id -> value, from `Metric`s whose attribute is `device-id` (int) or a key/value list (HLO metrics)."""
    out: dict[int, float] = {}
    for m in metrics:
        device = device_id(m.attribute)
        if device is None:
            continue
        gauge = m.gauge
        kind = gauge.WhichOneof("value")
        if kind == "as_int":
            out[device] = float(gauge.as_int)
        elif kind == "as_double":
            out[device] = float(gauge.as_double)
    return out


def device_id(attribute: Any) -> int | None:
    """The device of a metric: `device-id` as int_attr (memory, duty cycle), or `device_ordinal` in a kvlist.

    HLO metrics carry a key/value list with `device_ordinal`, a string in newer libtpu and an int in older ones
    (tpu_info/metrics.py, `get_hlo_queue_size`).
    """
    value = attribute.value
    kind = value.WhichOneof("attr")
    if kind == "int_attr" and attribute.key == "device-id":
        return int(value.int_attr)
    if kind == "kvlist_attr":
        for attr in value.kvlist_attr.attributes:
            if attr.key != "device_ordinal":
                continue
            inner = attr.value.WhichOneof("attr")
            if inner == "int_attr":
                return int(attr.value.int_attr)
            if inner == "string_attr" and attr.value.string_attr.isdigit():
                return int(attr.value.string_attr)
    return None


def timings(metrics: Iterable[Any]) -> dict[int, Timing]:
    """device -> HLO execution time, from libtpu's distributions in microseconds."""
    out: dict[int, Timing] = {}
    for m in metrics:
        device = device_id(m.attribute)
        dist = m.distribution
        if device is None or dist.count <= 0:  # no executions yet: nothing to report (never a made-up 1.0)
            continue
        bounds = bucket_bounds(dist.bucket_options, len(dist.bucket_counts))
        if bounds is None:
            continue
        counts = list(dist.bucket_counts)
        out[device] = Timing(
            count=int(dist.count),
            mean_seconds=dist.mean / 1e6,
            quantiles=tuple((q, bucket_quantile(q, counts, bounds) / 1e6) for q in QUANTILES),
        )
    return out


def buffer_size(attribute: Any) -> str:
    """The group of a megascale entry, as tpu-info picks it: the `buffer-size` of its key/value list, else (older
    libtpu) the string value of the list's first attribute, else N/A (tpu_info/metrics.py, get_transfer_latency)."""
    attributes = attribute.value.kvlist_attr.attributes
    for attr in attributes:
        if attr.key == "buffer-size":
            return attr.value.string_attr or NO_BUFFER_SIZE
    if attributes and attributes[0].value.string_attr:
        return str(attributes[0].value.string_attr)
    return NO_BUFFER_SIZE


@dataclass
class _Group:
    layout: bytes  # the serialized bucket options every entry of the group shares
    options: Any
    counts: list[int] = field(default_factory=list)
    count: int = 0
    total: float = 0.0


def summaries(metrics: Iterable[Any], spec: HostDistribution) -> tuple[Summary, ...]:
    """The host's distributions of one megascale metric, by buffer size where it has them, in base units.

    As tpu-info does, the entries of a group (one per connection, peer or stream: libtpu's other attributes) are
    summed bucket by bucket and the quantiles taken from the sum (never an average of quantiles). An entry without
    a bucketed distribution (a gauge, a summary) is left out, and so is one whose bucket layout differs from the
    rest of its group's: counts of different buckets cannot be added.
    """
    groups: dict[str | None, _Group] = {}
    for m in metrics:
        if not m.HasField("distribution"):
            continue
        dist = m.distribution
        if not dist.bucket_counts or dist.bucket_options.WhichOneof("options") is None:
            continue
        key = buffer_size(m.attribute) if spec.by_buffer_size else None
        layout = dist.bucket_options.SerializeToString(deterministic=True)
        group = groups.get(key)
        if group is None:
            group = groups[key] = _Group(layout, dist.bucket_options)
        elif group.layout != layout:
            continue
        counts = list(dist.bucket_counts)
        if len(counts) > len(group.counts):  # trailing empty buckets may be left out of a distribution
            group.counts.extend([0] * (len(counts) - len(group.counts)))
        for i, c in enumerate(counts):
            group.counts[i] += int(c)
        group.count += int(dist.count)
        group.total += int(dist.count) * float(dist.mean)
    out = []
    for key, group in groups.items():
        declared = _declared_buckets(group.options)
        if declared > len(group.counts):
            group.counts.extend([0] * (declared - len(group.counts)))
        bounds = bucket_bounds(group.options, len(group.counts))
        if bounds is None:
            continue
        quantiles: tuple[tuple[float, float], ...] = ()
        if sum(group.counts) > 0:
            quantiles = tuple((q, bucket_quantile(q, group.counts, bounds) * spec.to_base) for q in QUANTILES)
        out.append(Summary(key, group.count, group.total * spec.to_base, quantiles))
    return tuple(sorted(out, key=lambda s: s.buffer_size or ""))


def _declared_buckets(options: Any) -> int:
    """How many buckets the layout declares (its finite ones, the underflow and the overflow); 0 when it does not."""
    kind = options.WhichOneof("options")
    if kind in ("exponential_buckets", "linear_buckets"):
        finite = int(getattr(options, kind).num_finite_buckets)
        return finite + 2 if finite > 0 else 0
    if kind == "explicit_buckets":
        return len(options.explicit_buckets.bounds) + 1
    return 0


def bucket_bounds(options: Any, n: int) -> list[tuple[float, float]] | None:
    """(lower, upper) of each of `n` buckets: bucket 0 is the underflow, the last one the overflow.

    The layout of google.api.Distribution, which libtpu's `Distribution` copies (tpu_metric_service.proto).
    """
    kind = options.WhichOneof("options")
    if kind == "exponential_buckets":
        e = options.exponential_buckets
        edges = [e.scale * e.growth_factor**i for i in range(n - 1)]
    elif kind == "linear_buckets":
        lin = options.linear_buckets
        edges = [lin.offset + lin.width * i for i in range(n - 1)]
    elif kind == "explicit_buckets":
        edges = list(options.explicit_buckets.bounds)[: n - 1]
    else:
        return None
    if len(edges) != n - 1 or n < 2:
        return None
    lowers = [0.0, *edges]
    uppers = [*edges, math.inf]
    return list(zip(lowers, uppers, strict=True))


def bucket_quantile(q: float, counts: list[int], bounds: list[tuple[float, float]]) -> float:
    """The q-quantile, interpolated linearly inside its bucket (as Prometheus's histogram_quantile and tpu-info do).

    A quantile in the overflow bucket is its lower bound: there is no upper one to interpolate to.
    """
    rank = q * sum(counts)
    below = 0
    for count, (lower, upper) in zip(counts, bounds, strict=True):
        if count > 0 and below + count >= rank:
            if math.isinf(upper):
                return lower
            return lower + (upper - lower) * (rank - below) / count
        below += count
    return bounds[-1][0]
