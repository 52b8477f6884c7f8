"""The nvml collector without NVML: its flags, how NVML's GPUs are matched to JAX's devices, and the rendering of a
collector state of literal readings (every family, absent numbers, the labels of NVLink and MIG series, the one label
function).

Everything that reads NVML goes through the fake libnvidia-ml.so.1, which gcc builds:
tests/e2e/collectors/test_nvml.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric

import jaxmon.collectors.nvml as nvml_collector
from jaxmon.collectors.nvml import DeviceMatch, NvmlOptions, NvmlState, match_devices, render
from jaxmon.compose import default_settings, load_settings
from jaxmon.device_readings import DeviceInfo
from jaxmon.families.nvml import NvLinkTotals
from jaxmon.sources.nvml import GpuReading, MigDevice, NvLink, Process, ProcessUtilization, RemappedRows
from tests.deploy_files import readme_metrics
from tests.helpers import Samples, parse_samples, sample


def jax_gpus(*ids: int, process_index: int = 0) -> list[DeviceInfo]:
    return [DeviceInfo(i, "gpu", "NVIDIA H100 80GB HBM3", process_index=process_index) for i in ids]


def test_the_collector_is_auto_by_default_and_the_flags_set_it() -> None:
    assert default_settings().collector_options("nvml").enabled == "auto"
    assert load_settings(["--collector.nvml"]).collector_options("nvml").enabled is True
    assert load_settings(["--no-collector.nvml"]).collector_options("nvml").enabled is False
    options = load_settings(["--collector.nvml.xid-wait", "0.2"]).collector_options("nvml")
    assert isinstance(options, NvmlOptions) and options.xid_wait == 0.2


def test_nvml_gpus_are_matched_to_jax_devices_only_where_that_is_certain() -> None:
    pci = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    cpu = [DeviceInfo(i, "cpu", "cpu") for i in range(8)]
    assert match_devices(cpu, 8, pci) == DeviceMatch("nvml_index", {})
    # One GPU on each side: the same GPU whatever CUDA_VISIBLE_DEVICES says.
    assert match_devices(jax_gpus(0), 1, {"CUDA_VISIBLE_DEVICES": "GPU-abc"}) == DeviceMatch("only_gpu", {0: 0})
    assert match_devices([*cpu, *jax_gpus(0)], 1, {}) == DeviceMatch("only_gpu", {0: 0})
    # Every GPU, one process, PCI bus order on both sides.
    assert match_devices(jax_gpus(0, 1, 2, 3), 4, pci) == DeviceMatch("pci_bus_order", {0: 0, 1: 1, 2: 2, 3: 3})
    # CUDA's default order (fastest first), a narrowed set, a subset, or other ids: not certain.
    assert match_devices(jax_gpus(0, 1, 2, 3), 4, {}).how == "nvml_index"
    assert match_devices(jax_gpus(0, 1, 2, 3), 4, {**pci, "CUDA_VISIBLE_DEVICES": "0,1,2,3"}).how == "nvml_index"
    assert match_devices(jax_gpus(0, 1), 4, pci).how == "nvml_index"
    assert match_devices(jax_gpus(4, 5, 6, 7, process_index=1), 4, pci).how == "nvml_index"
    assert match_devices(jax_gpus(0), 2, pci).how == "nvml_index"


# --------------------------------------------------------------------------------------------------------------
# Rendering a collector state (literal readings; no NVML)
# --------------------------------------------------------------------------------------------------------------

MIG_SMALL = MigDevice(
    index=0,
    uuid="MIG-aaaaaaaa-0000-4444-5555-000000000009",
    gpu_instance=9,
    compute_instance=0,
    profile="1g.18gb",
    name="NVIDIA H200 MIG 1g.18gb",
    memory_total_bytes=17 << 30,
    memory_used_bytes=3 << 30,
    gpm=((2, 0.25), (5, 0.125)),  # its GPU instance's GPM (SM and tensor activity)
)
MIG_LARGE = MigDevice(
    index=2,
    uuid="MIG-bbbbbbbb-0002-4444-5555-000000000002",
    gpu_instance=2,
    compute_instance=1,
    profile=None,  # a name without a profile
    name="NVIDIA H200",
    memory_total_bytes=71 << 30,
    memory_used_bytes=None,
    duty_cycle_ratio=0.5,
)

BUSY = ProcessUtilization(77, 0.61, 0.22, 0.03, 0.04, 6)
FULL = GpuReading(
    index=3,
    name="NVIDIA H200",
    uuid="GPU-33333333-1111-2222-3333-000000000003",
    pci_bus_id="00000000:1B:00.0",
    memory_total_bytes=141 << 30,
    memory_used_bytes=70 << 30,
    duty_cycle_ratio=0.9,
    memory_bandwidth_utilization_ratio=0.4,
    encoder_utilization_ratio=0.05,
    decoder_utilization_ratio=0.25,
    power_watts=650.5,
    power_limit_watts=700.0,
    power_management_limit_watts=690.0,
    energy_joules_total=1234.5,
    temperature_celsius=71.0,
    fan_speed_ratios=((0, 0.3), (2, 1.05)),
    graphics_clock_hertz=1.98e9,
    sm_clock_hertz=1.97e9,
    memory_clock_hertz=2.619e9,
    video_clock_hertz=1.755e9,
    graphics_clock_max_hertz=1.98e9,
    sm_clock_max_hertz=1.98e9,
    memory_clock_max_hertz=2.619e9,
    video_clock_max_hertz=1.965e9,
    clocks_event_reasons=0x4,
    ecc_corrected_total=8,
    ecc_uncorrected_total=1,
    remapped_rows=RemappedRows(correctable=5, uncorrectable=2, pending=True, failed=False),
    pcie_tx_bytes_per_second=1.5e9,
    pcie_rx_bytes_per_second=2.5e9,
    pcie_replays_total=11,
    nvlinks=(NvLink(0, True, 100, 200, 1, 2, 3, 4), NvLink(1, False), NvLink(2, True, 300, None, 0, None, 0, 0)),
    mig_enabled=True,
    mig_devices=(MIG_SMALL, MIG_LARGE),
    processes=(Process(77, 5 << 30), Process(78, None)),
    process_utilization=(
        ProcessUtilization(77, 0.61, 0.22, 0.03, 0.04, 6),
        ProcessUtilization(78, 0.0, 0.0, 0.0, 0.0, 0),
    ),
    gpm_supported=True,
    # GPM metric id -> ratio: every metric jaxmon reads but FP32's (failed this interval: absent).
    gpm=(
        (1, 0.95),
        (2, 0.8),
        (3, 0.35),
        (4, 0.05),
        (5, 0.6),
        (6, 0.0),
        (7, 0.55),
        (9, 0.01),
        (10, 0.45),
        (11, 0.002),
        (13, 0.03),
    ),
)


def rendered(state: NvmlState, workloads: dict[int, str] | None = None, **options: Any) -> Samples:
    class Families:
        def collect(self) -> Iterator[Metric]:
            yield from (f for f in render(state, workloads or {}, **options) if f.samples)

    registry = CollectorRegistry()
    registry.register(Families())
    return parse_samples(generate_latest(registry).decode())


def nvml_options(*argv: str) -> NvmlOptions:
    options = load_settings(list(argv)).collector_options("nvml")
    assert isinstance(options, NvmlOptions)
    return options


def gpu(index: int, **extra: str) -> dict[str, str]:
    return {"device": str(index), "platform": "gpu", "source": "nvml", **extra}


def test_every_reading_of_a_gpu_is_its_series_with_its_value() -> None:
    s = rendered(NvmlState(gpus=(FULL,), xid={(3, 79): 2}))
    g = gpu(3)
    expected = {
        "jaxmon_device_source_up": 1,
        "jaxmon_device_memory_total_bytes": 141 << 30,
        "jaxmon_device_memory_used_bytes": 70 << 30,
        "jaxmon_device_duty_cycle_ratio": 0.9,
        "jaxmon_device_memory_bandwidth_utilization_ratio": 0.4,
        "jaxmon_device_encoder_utilization_ratio": 0.05,
        "jaxmon_device_decoder_utilization_ratio": 0.25,
        "jaxmon_device_power_watts": 650.5,
        "jaxmon_device_power_limit_watts": 700.0,
        "jaxmon_device_power_management_limit_watts": 690.0,
        "jaxmon_device_energy_joules_total": 1234.5,
        "jaxmon_device_temperature_celsius": 71.0,
        "jaxmon_device_graphics_clock_hertz": 1.98e9,
        "jaxmon_device_sm_clock_hertz": 1.97e9,
        "jaxmon_device_memory_clock_hertz": 2.619e9,
        "jaxmon_device_video_clock_hertz": 1.755e9,
        "jaxmon_device_graphics_clock_max_hertz": 1.98e9,
        "jaxmon_device_sm_clock_max_hertz": 1.98e9,
        "jaxmon_device_memory_clock_max_hertz": 2.619e9,
        "jaxmon_device_video_clock_max_hertz": 1.965e9,
        "jaxmon_device_pcie_replays_total": 11,
        "jaxmon_device_row_remapping_pending": 1,
        "jaxmon_device_row_remapping_failed": 0,
        "jaxmon_device_mig_enabled": 1,
    }
    for name, value in expected.items():
        assert sample(s, name, **g) == value, name
    assert sample(s, "jaxmon_device_fan_speed_ratio", **g, fan="0") == 0.3
    assert sample(s, "jaxmon_device_fan_speed_ratio", **g, fan="2") == 1.05
    assert sample(s, "jaxmon_device_fan_speed_ratio", **g, fan="1") is None
    assert sample(s, "jaxmon_device_pcie_throughput_bytes_per_second", **g, direction="tx") == 1.5e9
    assert sample(s, "jaxmon_device_pcie_throughput_bytes_per_second", **g, direction="rx") == 2.5e9
    assert sample(s, "jaxmon_device_remapped_rows_total", **g, kind="correctable") == 5
    assert sample(s, "jaxmon_device_remapped_rows_total", **g, kind="uncorrectable") == 2
    assert sample(s, "jaxmon_device_throttled", **g, reason="sw_power_cap") == 1
    assert sample(s, "jaxmon_device_ecc_errors_total", **g, kind="uncorrected") == 1
    assert sample(s, "jaxmon_device_xid_errors_total", **g, xid="79") == 2
    assert sample(s, "jaxmon_process_device_memory_bytes", **g, pid="77") == 5 << 30
    assert sample(s, "jaxmon_process_device_memory_bytes", **g, pid="78") is None


def test_nvlink_traffic_and_errors_are_summed_per_gpu_by_default_and_each_link_keeps_its_state() -> None:
    s = rendered(NvmlState(gpus=(FULL,)))
    g = gpu(3)
    assert [sample(s, "jaxmon_device_nvlink_active", **g, link=str(n)) for n in range(3)] == [1, 0, 1]
    data = {k: v for k, v in s.items() if k[0] == "jaxmon_device_nvlink_data_bytes_total"}
    assert data == {
        ("jaxmon_device_nvlink_data_bytes_total", frozenset({**g, "direction": "tx"}.items())): 400,
        ("jaxmon_device_nvlink_data_bytes_total", frozenset({**g, "direction": "rx"}.items())): 200,
    }
    errors = {dict(k[1])["kind"]: v for k, v in s.items() if k[0] == "jaxmon_device_nvlink_errors_total"}
    assert errors == {"replay": 1, "recovery": 2, "crc_flit": 3, "crc_data": 4}
    assert not [k for k in s if "link" in dict(k[1]) and k[0] != "jaxmon_device_nvlink_active"]
    # The collector's sums (a link down counting with its last reading) are used where the state has them.
    totals = {3: NvLinkTotals({"tx": 1000}, {"replay": 9})}
    s = rendered(NvmlState(gpus=(FULL,), nvlink_totals=totals))
    assert sample(s, "jaxmon_device_nvlink_data_bytes_total", **g, direction="tx") == 1000
    assert sample(s, "jaxmon_device_nvlink_data_bytes_total", **g, direction="rx") is None
    assert sample(s, "jaxmon_device_nvlink_errors_total", **g, kind="replay") == 9


def test_processes_beyond_the_bound_are_counted_per_gpu_not_given_a_series_each() -> None:
    many = (*(Process(1000 + n, (n + 1) << 20) for n in range(40)), Process(5, None))
    bounded = replace(FULL, processes=many)
    s = rendered(NvmlState(gpus=(bounded,)), {1039: "trainer", 1000: "small"}, max_processes=3)
    g = gpu(3)
    procs = {dict(k[1])["pid"]: (dict(k[1]).get("workload"), v) for k, v in s.items() if k[0].endswith("memory_bytes")}
    assert procs == {"1039": ("trainer", 40 << 20), "1038": (None, 39 << 20), "1037": (None, 38 << 20)}
    assert sample(s, "jaxmon_process_device_memory_other_bytes", **g) == sum(n << 20 for n in range(1, 38))
    assert sample(s, "jaxmon_process_device_memory_other_processes", **g) == 37
    # Within the bound (16 by default): every process has its series, and the others are 0.
    s = rendered(NvmlState(gpus=(FULL,)))
    assert sample(s, "jaxmon_process_device_memory_bytes", **g, pid="77") == 5 << 30
    assert sample(s, "jaxmon_process_device_memory_other_bytes", **g) == 0
    assert sample(s, "jaxmon_process_device_memory_other_processes", **g) == 0
    # A GPU whose process list NVML does not report has none of them.
    s = rendered(NvmlState(gpus=(replace(FULL, processes=None, process_utilization=None),)))
    assert not [k for k in s if k[0].startswith("jaxmon_process_")]
    assert nvml_options().max_processes == 16
    assert nvml_options("--collector.nvml.max-processes", "0").max_processes == 0


PROCESS_UTILIZATION = {
    "jaxmon_process_sm_utilization_ratio": "sm",
    "jaxmon_process_memory_bandwidth_utilization_ratio": "memory",
    "jaxmon_process_encoder_utilization_ratio": "encoder",
    "jaxmon_process_decoder_utilization_ratio": "decoder",
}


def test_per_process_utilization_is_a_series_per_pid_labelled_as_the_process_memory() -> None:
    s = rendered(NvmlState(gpus=(FULL,)), {77: "trainer"})
    g = gpu(3)
    for name, attr in PROCESS_UTILIZATION.items():
        assert sample(s, name, **g, pid="77", workload="trainer") == getattr(BUSY, attr)
        assert sample(s, name, **g, pid="78") == 0.0  # running, not sampled since the last poll: idle
    memory = {frozenset(dict(k[1]).keys()) for k in s if k[0] == "jaxmon_process_device_memory_bytes"}
    sm = {frozenset(dict(k[1]).keys()) for k in s if k[0] == "jaxmon_process_sm_utilization_ratio"}
    assert sm == memory | {frozenset(gpu(3, pid="78"))}  # the same label names (78 has no memory figure)
    # None (MIG mode, a driver without the calls) and () (nothing sampled, nothing running) give no series.
    for none in (None, ()):
        s = rendered(NvmlState(gpus=(replace(FULL, process_utilization=none),)))
        assert not [k for k in s if k[0] in PROCESS_UTILIZATION]


def test_per_process_utilization_keeps_the_busiest_by_sm_within_the_bound() -> None:
    many = tuple(ProcessUtilization(1000 + n, (n % 7) / 10, n / 100, 0.0, 0.0, 3) for n in range(40))
    s = rendered(NvmlState(gpus=(replace(FULL, process_utilization=many),)), max_processes=3)
    sm = {dict(k[1])["pid"]: v for k, v in s.items() if k[0] == "jaxmon_process_sm_utilization_ratio"}
    # SM 0.6 for n = 6, 13, 20, 27, 34: the highest memory bandwidth breaks the tie.
    assert sm == {"1034": 0.6, "1027": 0.6, "1020": 0.6}
    mem = {dict(k[1])["pid"] for k in s if k[0] == "jaxmon_process_memory_bandwidth_utilization_ratio"}
    assert mem == set(sm)  # every sibling keeps the same processes
    s = rendered(NvmlState(gpus=(replace(FULL, process_utilization=many),)), max_processes=0)
    assert not [k for k in s if k[0] in PROCESS_UTILIZATION]


def test_nvlink_series_are_per_link_with_the_option_and_an_inactive_link_has_its_state_alone() -> None:
    assert nvml_options().nvlink_links is False
    assert nvml_options("--collector.nvml.nvlink-links").nvlink_links is True
    s = rendered(NvmlState(gpus=(FULL,)), nvlink_links=True)
    g = gpu(3)
    assert [sample(s, "jaxmon_device_nvlink_active", **g, link=str(n)) for n in range(3)] == [1, 0, 1]
    assert sample(s, "jaxmon_device_nvlink_data_bytes_total", **g, link="0", direction="tx") == 100
    assert sample(s, "jaxmon_device_nvlink_data_bytes_total", **g, link="0", direction="rx") == 200
    assert sample(s, "jaxmon_device_nvlink_data_bytes_total", **g, link="2", direction="rx") is None
    errors = {k: v for k, v in s.items() if k[0] == "jaxmon_device_nvlink_errors_total"}
    assert {(dict(k[1])["link"], dict(k[1])["kind"]): v for k, v in errors.items()} == {
        ("0", "replay"): 1,
        ("0", "recovery"): 2,
        ("0", "crc_flit"): 3,
        ("0", "crc_data"): 4,
        ("2", "replay"): 0,
        ("2", "crc_flit"): 0,
        ("2", "crc_data"): 0,
    }
    assert {k[0] for k in s if ("link", "1") in k[1]} == {"jaxmon_device_nvlink_active"}


def test_mig_devices_carry_their_gpu_labels_and_their_uuid_instances_and_profile() -> None:
    s = rendered(NvmlState(gpus=(FULL,)))
    small = gpu(3, mig_uuid=MIG_SMALL.uuid, gpu_instance="9", compute_instance="0", profile="1g.18gb")
    large = gpu(3, mig_uuid=MIG_LARGE.uuid, gpu_instance="2", compute_instance="1", profile="")
    assert s.get(("jaxmon_mig_device_info", frozenset({**small, "name": "NVIDIA H200 MIG 1g.18gb"}.items()))) == 1
    assert s.get(("jaxmon_mig_device_info", frozenset({**large, "name": "NVIDIA H200"}.items()))) == 1
    assert sample(s, "jaxmon_mig_device_memory_total_bytes", **small) == 17 << 30
    assert sample(s, "jaxmon_mig_device_memory_used_bytes", **small) == 3 << 30
    assert sample(s, "jaxmon_mig_device_duty_cycle_ratio", **small) is None
    assert sample(s, "jaxmon_mig_device_memory_used_bytes", **large) is None
    assert sample(s, "jaxmon_mig_device_duty_cycle_ratio", **large) == 0.5
    assert NvmlState(gpus=(FULL,)).mig_uuids(3) == (MIG_SMALL.uuid, MIG_LARGE.uuid)
    assert NvmlState(gpus=(FULL,)).mig_uuids(0) == ()


def test_gpm_values_are_ratio_series_per_gpu_and_gpu_instance_and_a_failed_metric_is_absent() -> None:
    s = rendered(NvmlState(gpus=(FULL,)), gpm_pipes=True)
    g = gpu(3)
    assert sample(s, "jaxmon_device_gpm_supported", **g) == 1
    assert sample(s, "jaxmon_device_graphics_engine_active_ratio", **g) == 0.95
    assert sample(s, "jaxmon_device_sm_active_ratio", **g) == 0.8
    assert sample(s, "jaxmon_device_sm_occupancy_ratio", **g) == 0.35
    assert sample(s, "jaxmon_device_tensor_active_ratio", **g) == 0.6
    assert sample(s, "jaxmon_device_dram_active_ratio", **g) == 0.45
    pipes = {dict(k[1])["pipe"]: v for k, v in s.items() if k[0] == "jaxmon_device_pipe_active_ratio"}
    assert pipes == {
        "integer": 0.05,
        "tensor_dfma": 0.0,  # a real 0: NVML reported it
        "tensor_hmma": 0.55,
        "tensor_imma": 0.01,
        "fp64": 0.002,
        "fp16": 0.03,
    }, "fp32 failed: absent, never 0"
    small = gpu(3, mig_uuid=MIG_SMALL.uuid, gpu_instance="9", compute_instance="0", profile="1g.18gb")
    assert sample(s, "jaxmon_device_sm_active_ratio", **small) == 0.25
    assert sample(s, "jaxmon_device_tensor_active_ratio", **small) == 0.125
    assert sample(s, "jaxmon_device_gpm_supported", **small) is None, "support is the GPU's"
    assert len([k for k in s if k[0] == "jaxmon_device_sm_active_ratio"]) == 2, "MIG_LARGE has no GPM values"
    # A GPU without GPM: 0, and no GPM series; one not asked (--collector.nvml.gpm false): nothing at all.
    unsupported = replace(FULL, index=4, gpm_supported=False, gpm=None, mig_devices=None)
    unasked = replace(FULL, index=5, gpm_supported=None, gpm=None, mig_devices=None)
    s = rendered(NvmlState(gpus=(unsupported, unasked)))
    assert sample(s, "jaxmon_device_gpm_supported", **gpu(4)) == 0
    gpm_names = {"jaxmon_device_gpm_supported", "jaxmon_device_sm_active_ratio", "jaxmon_device_pipe_active_ratio"}
    assert {name for name, labels in s if name in gpm_names} == {"jaxmon_device_gpm_supported"}
    assert sample(s, "jaxmon_device_gpm_supported", **gpu(5)) is None


def test_the_gpm_option_is_auto_by_default_and_takes_true_and_false() -> None:
    assert nvml_options().gpm == "auto"
    assert nvml_options("--collector.nvml.gpm", "false").gpm is False
    # Each pipe's activity: 7 series a GPU, off by default (dcgm-exporter's default field list leaves them out).
    assert nvml_options().gpm_pipes is False and nvml_options("--collector.nvml.gpm-pipes").gpm_pipes is True
    default = rendered(NvmlState(gpus=(FULL,)))
    assert not [k for k in default if k[0] == "jaxmon_device_pipe_active_ratio"]
    assert sample(default, "jaxmon_device_tensor_active_ratio", **gpu(3)) == 0.6
    assert nvml_options("--collector.nvml.gpm", "true").gpm is True
    assert nvml_options("--collector.nvml.gpm", "auto").gpm == "auto"


def test_a_number_nvml_did_not_report_is_an_absent_series_never_zero() -> None:
    bare = GpuReading(index=0, name="NVIDIA H200", uuid="GPU-0", pci_bus_id="00000000:18:00.0")
    s = rendered(NvmlState(gpus=(bare,)))
    assert {name for name, _ in s} == {"jaxmon_device_source_up", "jaxmon_device_info"}
    lost = GpuReading(index=1, error="NVML_ERROR_GPU_IS_LOST (GPU is lost)")
    s = rendered(NvmlState(gpus=(lost, FULL)))
    assert {name for name, labels in s if ("device", "1") in labels} == {"jaxmon_device_source_up"}
    assert sample(s, "jaxmon_device_source_up", **gpu(1)) == 0
    assert sample(s, "jaxmon_device_nvlink_active", **gpu(3), link="0") == 1  # the other GPU's series stay


def test_every_series_gets_its_gpu_labels_from_the_one_label_function(monkeypatch: pytest.MonkeyPatch) -> None:
    """A label added in `_labels` (as pod labels will be) reaches every nvml series, MIG devices' included."""
    original = nvml_collector._labels

    def with_pod(gpu: GpuReading, match: DeviceMatch, mig: MigDevice | None = None) -> dict[str, str]:
        owner = mig.uuid if mig is not None else gpu.uuid
        return {**original(gpu, match, mig), "pod": f"pod-of-{owner}"}

    monkeypatch.setattr(nvml_collector, "_labels", with_pod)
    s = rendered(NvmlState(gpus=(FULL,), xid={(3, 48): 1}), {77: "trainer"})
    assert len(s) > 50
    for name, labels in s:
        pod = dict(labels).get("pod")
        want = dict(labels).get("mig_uuid", FULL.uuid)
        assert pod == f"pod-of-{want}", (name, dict(labels))


def test_every_family_the_collector_renders_is_in_the_readme_reference() -> None:
    names = {name for name, _ in rendered(NvmlState(gpus=(FULL,), xid={(3, 79): 1}))}
    known = readme_metrics()
    assert names - set(known) == set()
    # And the types agree: counters end in _total.
    for name in names:
        assert (known[name] == "counter") == name.endswith("_total"), name
