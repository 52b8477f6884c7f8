"""Who owns each series: one transform between the snapshot and the exposition, as dcgm-exporter's
`PodMapper.Process` is one transform over every metric.

Two inputs meet here, both read through the exchange from the snapshot being rendered:

- **Owners** (`OWNERS`): what the owner sources know, each an `Owners` map from device identities (GPU UUID, MIG
  UUID, minor number, PCI bus id, TPU chip: jaxmon.exchange's kinds) and from process ids to the containers that
  own them. Today the kubelet's device-plugin allocations give it (jaxmon.ownership.attribution, offered by the
  kubernetes collector); every other source (DRA through ResourceSlices, processes through their cgroups) offers one
  more, and the offers are merged: owners of one identity from several sources are its owners together.
- **Identities** (`DEVICE_IDENTITIES`): which device each series of a collector is about, offered by the collectors
  that export devices (NVML: each GPU's series, and a JAX device's where the nvml collector matched it to a GPU;
  libtpu: each chip's and the host's). No collector stamps owners itself (tests/unit/test_layout.py holds it).

`OwnerTransform` adds `namespace`, `pod` and `container` to every sample whose device (or pid) has owners, whatever
collector made it. The exposition calls it once per snapshot version it renders, never per scrape; where no source
knows an owner it returns the families untouched.

The rules (the labels and the tests of the per-collector stamping before it):

- Several owners of one device (a time-sliced GPU) give one label set, each label the sorted distinct values of the
  owners joined by commas (no Kubernetes name holds a comma): one series per device, so sums over pods or
  namespaces count the device once.
- A series with `mig_uuid` is its MIG device's: it carries the MIG device's owners, never its parent GPU's, and a
  MIG device's owner does not label the parent GPU's series.
- An identity in `Owners.sole` names candidates, not sharers: its owners label a series only where there is
  exactly one (the node's TPU chips, whose numbering no source relates to libtpu's: the one container on the node
  holding TPU chips, none where several do).
- A series with a `pid` label whose pid has owners (`Owners.pids`) carries the process's owners instead of its
  device's; a pid no source knows keeps its device's, as before. A pid whose owners are an empty set (a process
  of a pod its source cannot name: jaxmon.ownership.pidowners) carries no owner labels at all, never its device's, which
  may be other pods'.
- A series that already carries `pod` (the kubelet's own metrics.KUBERNETES_POD_DEVICE_INFO, a workload's
  scheduler labels) is left as it is.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from prometheus_client.core import Metric

from jaxmon.exchange import (
    DEVICE_IDENTITIES,
    JAX_DEVICE,
    MIG_UUID,
    OWNERS,
    DeviceId,
    DeviceIdentities,
    Exchange,
    Owners,
    SeriesKey,
    device_id,
    owner_labels,
)
from jaxmon.snapshot import Snapshot

# The labels the transform writes (and the only ones): who owns the series' device or process.
OWNER_LABELS = ("namespace", "pod", "container")


def merged_identities(many: Iterable[DeviceIdentities]) -> dict[SeriesKey, tuple[DeviceId, ...]]:
    """Several collectors' identities as one map (a key two of them name gets both's identities)."""
    out: dict[SeriesKey, tuple[DeviceId, ...]] = {}
    for identities in many:
        for key, ids in identities.items():
            out[key] = out.get(key, ()) + tuple(ids)
    return out


_MISS: Any = object()
# Distinct (device, mig, pid) keys, and distinct label sets, remembered per map; past it (pids that keep changing)
# a memo starts again.
_MEMO_BOUND = 4096
_RELABELLED_BOUND = 65536


class OwnerIndex:
    """One snapshot's owners and identities, and the owner labels of each series key looked up so far."""

    def __init__(
        self, owners: Owners, identities: Mapping[SeriesKey, tuple[DeviceId, ...]], source: str, workload: str | None
    ) -> None:
        self.owners = owners
        self.identities = identities
        self._source = source
        self._workload = workload
        self._memo: dict[tuple[str | None, ...], dict[str, str]] = {}
        # A series' labels -> its labels with its owners' (None: it has none). Kept from one render to the next
        # while the map is the same: a device's label sets stay the same from poll to poll, so most renders build
        # no label dict at all (the exposition's label strings are cached by the same items).
        self._relabelled: dict[tuple[tuple[str, str], ...], dict[str, str] | None] = {}

    def relabel(self, labels: dict[str, str]) -> dict[str, str] | None:
        """`labels` with the owner labels of their series added; None when it has no owner (or already a `pod`)."""
        key = tuple(labels.items())
        found = self._relabelled.get(key, _MISS)
        if found is _MISS:
            if len(self._relabelled) >= _RELABELLED_BOUND:
                self._relabelled.clear()
            extra = None if "pod" in labels else self.labels_of(labels)
            found = self._relabelled[key] = {**labels, **extra} if extra else None
        return found  # type: ignore[no-any-return]

    def labels_of(self, labels: Mapping[str, str]) -> dict[str, str]:
        """The owner labels a series with `labels` gets ({}: none)."""
        get = labels.get
        key = (get("source"), get("platform"), get("device"), get("workload"), get("mig_uuid"), get("pid"))
        found = self._memo.get(key, _MISS)
        if found is _MISS:
            if len(self._memo) >= _MEMO_BOUND:
                self._memo.clear()
            found = self._memo[key] = self._resolve(*key)
        return found  # type: ignore[no-any-return]

    def _resolve(
        self,
        source: str | None,
        platform: str | None,
        device: str | None,
        workload: str | None,
        mig: str | None,
        pid: str | None,
    ) -> dict[str, str]:
        if pid is not None and self.owners.pids:
            process = self.owners.pids.get(int(pid)) if pid.isdigit() else None
            if process is not None:
                return owner_labels(process)  # {} for an empty set: a process known to be nobody's we can name
        if mig is not None:
            return self.owners.labels((device_id(MIG_UUID, mig),))
        if source is None or source == self._source:
            # This process's own JAX devices (memory, probe, their metrics.DEVICE_INFO row): the ones labelled as
            # the snapshot labels them. A spooled workload's device (another `workload`) is numbered by its own
            # process, which says nothing of which GPU it is.
            if workload != self._workload:
                return {}
            source = JAX_DEVICE
        ids = self.identities.get((source, platform or "", device or ""))
        return self.owners.labels(ids) if ids else {}


def apply_owners(families: Sequence[Metric], index: OwnerIndex) -> None:
    """Add the owner labels to every sample of `families` that has owners. The families are fresh, so their sample
    lists are changed in place; the samples' label dicts are not (a collector may keep and reuse one)."""
    relabel = index.relabel
    new = tuple.__new__
    for fam in families:
        samples = fam.samples
        for i, s in enumerate(samples):
            labels = relabel(s.labels)
            if labels is not None:
                # Sample(name, labels, value, ...) with only the labels new: what s._replace(labels=...) makes, at
                # half its cost (a render relabels every sample of an owned device).
                samples[i] = new(type(s), (s[0], labels, *s[2:]))


class OwnerTransform:
    """The exposition's owner step: reads the owners and identities offered in the snapshot being rendered, and
    labels its families (jaxmon.exposition calls it once per snapshot version)."""

    def __init__(self, exchange: Exchange) -> None:
        self._exchange = exchange
        # The last inputs and their index, as one value: renders of filtered scrapes may run at once on threads.
        self._last: tuple[tuple[list[Owners], list[DeviceIdentities], str, str | None], OwnerIndex] | None = None

    def index(self, snap: Snapshot) -> OwnerIndex | None:
        """The owner index of `snap`; None where no source knows an owner (nothing to add)."""
        owners = [o for o in self._exchange.read(OWNERS, snap) if not o.empty]
        if not owners:
            return None
        identities = self._exchange.read(DEVICE_IDENTITIES, snap)
        inputs = (owners, identities, snap.source, snap.workload)
        last = self._last
        # The same map as the last snapshot's (a poll that changes readings, not owners or devices): its memos too.
        if last is not None and last[0] == inputs:
            return last[1]
        merged = owners[0] if len(owners) == 1 else Owners.merged(owners)
        index = OwnerIndex(merged, merged_identities(identities), snap.source, snap.workload)
        self._last = (inputs, index)
        return index

    def __call__(self, snap: Snapshot, families: list[Metric]) -> list[Metric]:
        index = self.index(snap)
        if index is not None:
            apply_owners(families, index)
        return families
