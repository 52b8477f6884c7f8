"""The device catalog: each device kind jaxmon knows, one entry each, every figure with its vendor source (as
tpu-info keeps chip facts in one enum).

An entry says, for one kind (JAX's `device_kind`; a GPU's is also NVML's name, which CUDA and so JAX report):
- its dense peak FLOP/s per chip by dtype (`bf16` is the denominator of MFU and HFU). Dense figures only: vendor
  sheets quote sparse ones (2x) beside them, and MFU against a sparse peak is half the truth;
- its HBM per chip, where one figure holds for every device of the kind;
- its TensorCores and how many JAX devices a chip is: a TPU v2, v3 or 7x chip is two JAX devices (one TensorCore
  each), a v4 or v5p chip one (a megacore of two); every GPU one;
- its links and their nominal bandwidth (below);
- a TPU's name in libtpu's and tpu-info's words (`v5e`) and the PCI device id tpu-info finds the chip by.

A kind the catalog does not know has no figure: no MFU, no nominal bandwidth, never a guessed default (Levanter
never maps "NVIDIA H200"; torchtitan falls back to an A100's figure for any GPU).

Links. A collective's link is the slowest its groups cross, fastest first (`LINKS`): `local` (CPU devices of one
process), `nvlink`, `ici` (TPU chips of one slice), `pcie`, `sys` (GPUs across the CPUs' interconnect), `dcn` (TPU
slices), `network` (hosts); `unknown` where it cannot be read. Nominal bandwidth is per JAX device and per
direction, in bytes per second: vendors quote NVLink, PCIe and TPU ICI as the sum of both directions (NVIDIA:
"NVLink 900 GB/s"; Google: "bidirectional ICI bandwidth per chip"), halved here as nccl-tests compares bus
bandwidth with one direction; network figures (a NIC's Gbps, a chip's DCN Gbps) are per direction already.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

LOCAL, NVLINK, ICI, PCIE, SYS = "local", "nvlink", "ici", "pcie", "sys"
DCN, NETWORK, UNKNOWN = "dcn", "network", "unknown"
# Fastest first: a group's link is the one of its pairs furthest down this list.
LINKS = (LOCAL, NVLINK, ICI, PCIE, SYS, DCN, NETWORK)
_RANK = {link: i for i, link in enumerate(LINKS)}

GB = 1e9
GIB = 1 << 30
GBIT = 1e9 / 8


def slowest(links: Iterable[str]) -> str:
    """The slowest of known links."""
    return max(links, key=lambda link: _RANK[link])


# NVML's nvmlGpuTopologyLevel_t (the closest common ancestor of two GPUs on the PCI tree) as a link:
# NVML_TOPOLOGY_INTERNAL 0, SINGLE 10, MULTIPLE 20, HOSTBRIDGE 30: one PCIe host bridge or below; NODE 40,
# SYSTEM 50: across the CPUs' interconnect (NUMA nodes). Source: nvml.h.
NVML_TOPOLOGY = {0: PCIE, 10: PCIE, 20: PCIE, 30: PCIE, 40: SYS, 50: SYS}


def nvml_link(common_ancestor: int | None, p2p_nvlink: bool | None, nvlink_peer: bool) -> str | None:
    """The link between two GPUs of one host from NVML's answers: `nvlink_peer` (one's NVLink remote PCI info names
    the other, or P2P status over NVLink is OK), else the common ancestor (`NVML_TOPOLOGY`, a level between two
    known ones reads as the faster's superset: <= 30 pcie, <= 50 sys); None where NVML said nothing usable."""
    if nvlink_peer or p2p_nvlink:
        return NVLINK
    if common_ancestor is None:
        return None
    if common_ancestor <= 30:
        return PCIE
    if common_ancestor <= 50:
        return SYS
    return None


@dataclass(frozen=True)
class Figure:
    """A vendor's figure and where it comes from."""

    value: float
    source: str


@dataclass(frozen=True)
class Link:
    """A link of a device kind: the vendor's figure in bytes per second, whether it counts both directions, and its
    source."""

    kind: str  # one of LINKS
    vendor_bytes_per_second: float
    bidirectional: bool
    source: str

    @property
    def per_direction(self) -> float:
        """Bytes per second one way."""
        return self.vendor_bytes_per_second / 2 if self.bidirectional else self.vendor_bytes_per_second


@dataclass(frozen=True)
class DeviceKind:
    """One kind of device and what its vendor says of it (see the module's doc)."""

    name: str  # the vendor's product name
    platform: str  # "gpu" or "tpu"
    kinds: tuple[str, ...]  # JAX's device_kind (a GPU's: NVML's name too); prefixes where `prefix`
    prefix: bool = False
    peak_flops: Mapping[str, Figure] = field(default_factory=dict)  # dense, per chip, by dtype
    hbm_bytes: Figure | None = None  # per chip
    cores_per_chip: int = 1  # TensorCores
    devices_per_chip: int = 1  # JAX devices, by default
    links: tuple[Link, ...] = ()
    libtpu_name: str = ""  # a TPU's chip in libtpu's and tpu-info's words
    pci_device_id: str = ""  # a TPU's PCI device id (vendor 0x1ae0), as tpu-info detects chips

    @property
    def nvml_names(self) -> tuple[str, ...]:
        """NVML's names of the kind (nvmlDeviceGetName): a GPU's kinds, which CUDA, and JAX, report as NVML does."""
        return self.kinds if self.platform == "gpu" else ()


def _bf16(flops: float, source: str) -> dict[str, Figure]:
    return {"bf16": Figure(flops, source)}


# NVIDIA's Tensor Core GPU datasheets quote sparse figures; the dense ones are half (their footnote says so).
_A100_PEAK = {
    "bf16": Figure(312e12, "NVIDIA A100 datasheet (SXM4 and PCIe, 40 and 80 GB): BF16 tensor core 312 TFLOPS dense"),
    "int8": Figure(624e12, "NVIDIA A100 datasheet: INT8 tensor core 624 TOPS dense (1248 sparse)"),
}
_A100_PCIE_LINKS = (
    Link(PCIE, 64 * GB, True, "NVIDIA A100 datasheet: PCIe Gen4 64 GB/s"),
    Link(NVLINK, 600 * GB, True, "NVIDIA A100 datasheet: PCIe card, NVLink bridge 600 GB/s"),
)
_H100_SXM_PEAK = {
    "bf16": Figure(989e12, "NVIDIA H100 datasheet, SXM5: BF16 tensor core 1979 TFLOPS sparse / 2"),
    "fp8": Figure(1979e12, "NVIDIA H100 datasheet, SXM5: FP8 tensor core 3958 TFLOPS sparse / 2"),
    "int8": Figure(1979e12, "NVIDIA H100 datasheet, SXM5: INT8 tensor core 3958 TOPS sparse / 2"),
}
_SXM5_LINKS = (
    Link(NVLINK, 900 * GB, True, "NVIDIA H100 and H200 datasheets: NVLink 4 (SXM) 900 GB/s"),
    Link(PCIE, 128 * GB, True, "NVIDIA H100 and H200 datasheets: PCIe Gen5 128 GB/s"),
)

GPUS = (
    DeviceKind(
        "NVIDIA V100 SXM2",
        "gpu",
        ("Tesla V100-SXM2",),
        prefix=True,
        peak_flops={"fp16": Figure(125e12, "NVIDIA V100 datasheet, SXM2: tensor performance 125 TFLOPS (no bf16)")},
        links=(
            Link(NVLINK, 300 * GB, True, "NVIDIA V100 datasheet: NVLink 2 (SXM2) 300 GB/s"),
            Link(PCIE, 32 * GB, True, "NVIDIA V100 datasheet: PCIe Gen3 32 GB/s"),
        ),
    ),
    DeviceKind("NVIDIA A100", "gpu", ("NVIDIA A100",), prefix=True, peak_flops=_A100_PEAK),
    DeviceKind(
        "NVIDIA A100 SXM4",
        "gpu",
        ("NVIDIA A100-SXM4",),
        prefix=True,
        peak_flops=_A100_PEAK,
        links=(
            Link(NVLINK, 600 * GB, True, "NVIDIA A100 datasheet: NVLink 3 (SXM4) 600 GB/s"),
            Link(PCIE, 64 * GB, True, "NVIDIA A100 datasheet: PCIe Gen4 64 GB/s"),
        ),
    ),
    DeviceKind(
        "NVIDIA A100 PCIe",
        "gpu",
        ("NVIDIA A100-PCIE", "NVIDIA A100 80GB PCIe"),
        prefix=True,
        peak_flops=_A100_PEAK,
        links=_A100_PCIE_LINKS,
    ),
    DeviceKind(
        "NVIDIA H100 SXM5",
        "gpu",
        ("NVIDIA H100 80GB HBM3",),
        peak_flops=_H100_SXM_PEAK,
        hbm_bytes=Figure(80 * GB, "NVIDIA H100 datasheet, SXM5: 80 GB HBM3"),
        links=_SXM5_LINKS,
    ),
    DeviceKind(
        "NVIDIA H100 PCIe",
        "gpu",
        ("NVIDIA H100 PCIe",),
        peak_flops={
            "bf16": Figure(756e12, "NVIDIA H100 datasheet, PCIe: BF16 tensor core 1513 TFLOPS sparse / 2"),
            "fp8": Figure(1513e12, "NVIDIA H100 datasheet, PCIe: FP8 tensor core 3026 TFLOPS sparse / 2"),
            "int8": Figure(1513e12, "NVIDIA H100 datasheet, PCIe: INT8 tensor core 3026 TOPS sparse / 2"),
        },
        hbm_bytes=Figure(80 * GB, "NVIDIA H100 datasheet, PCIe: 80 GB HBM2e"),
        links=(
            Link(PCIE, 128 * GB, True, "NVIDIA H100 datasheet: PCIe Gen5 128 GB/s"),
            Link(NVLINK, 600 * GB, True, "NVIDIA H100 PCIe product brief: NVLink bridge 600 GB/s"),
        ),
    ),
    DeviceKind(
        "NVIDIA H100 NVL",
        "gpu",
        ("NVIDIA H100 NVL",),
        peak_flops={
            "bf16": Figure(835e12, "NVIDIA H100 datasheet, NVL: BF16 tensor core 1671 TFLOPS sparse / 2"),
            "fp8": Figure(1671e12, "NVIDIA H100 datasheet, NVL: FP8 tensor core 3341 TFLOPS sparse / 2"),
        },
        hbm_bytes=Figure(94 * GB, "NVIDIA H100 datasheet, NVL: 94 GB HBM3"),
    ),
    DeviceKind(
        "NVIDIA H200",
        "gpu",
        ("NVIDIA H200",),
        prefix=True,
        peak_flops={
            "bf16": Figure(989e12, "NVIDIA H200 datasheet, SXM: BF16 tensor core 1979 TFLOPS sparse / 2"),
            "fp8": Figure(1979e12, "NVIDIA H200 datasheet, SXM: FP8 tensor core 3958 TFLOPS sparse / 2"),
            "int8": Figure(1979e12, "NVIDIA H200 datasheet, SXM: INT8 tensor core 3958 TOPS sparse / 2"),
        },
        hbm_bytes=Figure(141 * GB, "NVIDIA H200 datasheet: 141 GB HBM3e"),
        links=_SXM5_LINKS,
    ),
    DeviceKind(
        "NVIDIA B200",
        "gpu",
        ("NVIDIA B200",),
        prefix=True,
        peak_flops={
            "bf16": Figure(2250e12, "NVIDIA DGX B200 datasheet: 18 PFLOPS dense FP16/BF16 / 8 GPUs"),
            "fp8": Figure(4500e12, "NVIDIA DGX B200 datasheet: 72 PFLOPS FP8 sparse / 2 / 8 GPUs"),
        },
        hbm_bytes=Figure(180 * GB, "NVIDIA DGX B200 datasheet: 1,440 GB GPU memory / 8 GPUs"),
        links=(Link(NVLINK, 1800 * GB, True, "NVIDIA HGX B200 datasheet: NVLink 5 1.8 TB/s per GPU"),),
    ),
    DeviceKind(
        "NVIDIA GB200",
        "gpu",
        ("NVIDIA GB200",),
        prefix=True,
        peak_flops=_bf16(2500e12, "NVIDIA GB200 NVL72 datasheet: 180 PFLOPS dense BF16 / 72 GPUs"),
    ),
)

# Google's Cloud TPU system architecture pages (per chip; JAX's jax/_src/pallas/mosaic/tpu_info.py agrees), and
# tpu-info's TpuChip (device.py) for the chip names and PCI ids.
TPUS = (
    DeviceKind(
        "TPU v2",
        "tpu",
        ("TPU v2",),
        peak_flops=_bf16(45e12, "Cloud TPU v2: 45 TFLOPS bf16 per chip"),
        hbm_bytes=Figure(16 * GIB, "Cloud TPU v2: 16 GiB HBM per chip"),
        cores_per_chip=2,
        devices_per_chip=2,
        libtpu_name="v2",
        pci_device_id="0x0027",  # subsystem 0x004e (v3 shares the device id: 0x004f)
    ),
    DeviceKind(
        "TPU v3",
        "tpu",
        ("TPU v3",),
        peak_flops=_bf16(123e12, "Cloud TPU v3: 123 TFLOPS bf16 per chip"),
        hbm_bytes=Figure(32 * GIB, "Cloud TPU v3: 32 GiB HBM per chip"),
        cores_per_chip=2,
        devices_per_chip=2,
        libtpu_name="v3",
        pci_device_id="0x0027",
    ),
    DeviceKind(
        "TPU v4",
        "tpu",
        ("TPU v4",),
        peak_flops={
            "bf16": Figure(275e12, "Cloud TPU v4: 275 TFLOPS bf16 per chip, one megacore device"),
            "int8": Figure(275e12, "Cloud TPU v4: 275 TOPS int8 per chip"),
        },
        hbm_bytes=Figure(32 * GIB, "Cloud TPU v4: 32 GiB HBM2 per chip"),
        cores_per_chip=2,
        libtpu_name="v4",
        pci_device_id="0x005e",
    ),
    DeviceKind(
        "TPU v5e",
        "tpu",
        ("TPU v5 lite", "TPU v5e"),
        peak_flops={
            "bf16": Figure(197e12, "Cloud TPU v5e: 197 TFLOPS bf16 per chip"),
            "int8": Figure(394e12, "Cloud TPU v5e: 394 TOPS int8 per chip"),
        },
        hbm_bytes=Figure(16 * GIB, "Cloud TPU v5e: 16 GiB HBM2 per chip"),
        links=(
            Link(
                ICI, 400 * GB, True, "Cloud TPU v5e system architecture: bidirectional ICI bandwidth per chip 400 GBps"
            ),
            Link(DCN, 200 * GBIT / 8, False, "Cloud TPU v5e system architecture: per-host NIC 2 x 100 Gbps / 8 chips"),
        ),
        libtpu_name="v5e",
        pci_device_id="0x0063",
    ),
    DeviceKind(
        "TPU v5p",
        "tpu",
        ("TPU v5", "TPU v5p"),
        peak_flops={
            "bf16": Figure(459e12, "Cloud TPU v5p: 459 TFLOPS bf16 per chip, one megacore device"),
            "int8": Figure(918e12, "Cloud TPU v5p: 918 TOPS int8 per chip"),
        },
        hbm_bytes=Figure(95 * GIB, "Cloud TPU v5p: 95 GiB HBM2e per chip"),
        cores_per_chip=2,
        links=(
            Link(
                ICI,
                1200 * GB,
                True,
                "Cloud TPU v5p system architecture: bidirectional ICI bandwidth per chip 1200 GBps",
            ),
            Link(DCN, 50 * GBIT, False, "Cloud TPU v5p system architecture: DCN bandwidth per chip 50 Gbps"),
        ),
        libtpu_name="v5p",
        pci_device_id="0x0062",
    ),
    DeviceKind(
        "TPU v6e",
        "tpu",
        ("TPU v6 lite", "TPU v6e"),
        peak_flops={
            "bf16": Figure(918e12, "Cloud TPU v6e (Trillium): 918 TFLOPS bf16 per chip"),
            "int8": Figure(1836e12, "Cloud TPU v6e (Trillium): 1836 TOPS int8 per chip"),
        },
        hbm_bytes=Figure(32 * GIB, "Cloud TPU v6e (Trillium): 32 GiB HBM per chip"),
        links=(
            Link(
                ICI, 800 * GB, True, "Cloud TPU v6e system architecture: bidirectional ICI bandwidth per chip 800 GBps"
            ),
        ),
        libtpu_name="v6e",
        pci_device_id="0x006f",
    ),
    DeviceKind(
        "TPU7x",
        "tpu",
        ("TPU7x",),
        peak_flops={
            "bf16": Figure(2307e12, "Cloud TPU7x (Ironwood): 2307 TFLOPS bf16 per chip, 2 devices"),
            "fp8": Figure(4614e12, "Cloud TPU7x (Ironwood): 4614 TFLOPS fp8 per chip"),
        },
        hbm_bytes=Figure(192 * GIB, "Cloud TPU7x (Ironwood): 192 GiB HBM per chip"),
        cores_per_chip=2,
        devices_per_chip=2,
        libtpu_name="7x",
        pci_device_id="0x0076",
    ),
)
KINDS = GPUS + TPUS


def lookup(device_kind: str) -> DeviceKind | None:
    """The entry of `device_kind`: an exact name first, then the longest matching prefix."""
    for entry in KINDS:
        if not entry.prefix and device_kind in entry.kinds:
            return entry
    prefixed = [(len(k), e) for e in KINDS if e.prefix for k in e.kinds if device_kind.startswith(k)]
    return max(prefixed, key=lambda item: item[0])[1] if prefixed else None


def device_peak(device_kind: str, num_cores: int | None, dtype: str = "bf16") -> float | None:
    """Dense peak FLOP/s of one JAX device of this kind at `dtype` (None: not in the catalog)."""
    entry = lookup(device_kind)
    figure = entry.peak_flops.get(dtype) if entry is not None else None
    if entry is None or figure is None:
        return None
    if num_cores is not None and num_cores > 0:  # a TPU device says how many of its chip's TensorCores it is
        return figure.value * min(num_cores, entry.cores_per_chip) / entry.cores_per_chip
    return figure.value / entry.devices_per_chip


def nominal_bandwidth(device_kind: str, overrides: Iterable[tuple[str, float]] = ()) -> dict[str, float]:
    """Each link's nominal bandwidth per direction (bytes/s) for one JAX device of `device_kind` ({} for a kind the
    catalog does not know); `overrides` (collector.training.link_bandwidth) replace or add links, for every kind.
    Cached per (kind, overrides): the tracker asks at every poll."""
    return dict(_nominal(device_kind, tuple(overrides)))


@functools.lru_cache(maxsize=64)
def _nominal(device_kind: str, overrides: tuple[tuple[str, float], ...]) -> tuple[tuple[str, float], ...]:
    entry = lookup(device_kind)
    out = {link.kind: link.per_direction / entry.devices_per_chip for link in entry.links} if entry else {}
    out.update((link, value) for link, value in overrides if value > 0)
    return tuple(sorted(out.items()))
