"""A real Prometheus scraping real jaxmon daemons evaluates every dashboard query, every dashboard variable and every
alert expression through its HTTP API: each must parse, and each that should have data must return series.

The scraped setup (one module fixture, all processes killed at teardown):
- jaxmon-replay: tests/fixtures/shapes.json (every allocator shape, a failing device, a full device) and the compose
  demo's deploy/demo/replay.json (a fragmented, nearly full GPU);
- jaxmon-cpu: the 8 JAX CPU devices with the probe every second; cpu:3's probe is then made to hang (faults file);
- jaxmon-spool: a sidecar reading a spool fed by two `publish` children of tests/workloads/train.py, with the TPU
  backend requested so that it fails; one child (the trainer) holds an array replicated over its 8 devices and one
  in pinned_host memory (the placement panels); then it compiles 40 programs, the other is killed, and a broken
  file is dropped into the spool; its tpu collector points at an address nobody listens on;
- jaxmon-tpu: a TPU sidecar (JAX on CPU) reading a loopback libtpu runtime metrics service (tests/fake_libtpu.py)
  with one idle chip and one nearly full, and every megascale distribution of a multi-slice host, and the same spool;
- jaxmon-nvml: the fake libnvidia-ml.so.1 (tests/fakenvml) with four GPUs: GPU 0 hot, thermally throttled and at its
  power cap, with fans, busy (97 %) with its SMs active 12 % of the time (GPM), held by pod team-a/train-0, where the
  trainer below runs (so its MFU is GPU 0's); GPU 1 nearly full with uncorrected ECC errors, a failed row
  remapping, an NVLink down, and after start an Xid 79, NVLink replays, PCIe replays and a row remapped for an
  uncorrectable error, its process (pid 4242) a Slurm job's (a procfs the test writes: --path.procfs); GPU 2 lost;
  GPU 3 in MIG mode with two MIG devices; GPU 0's three processes are three pods' (their cgroups in that procfs, the
  pods listed by the fake API server, tests/fake_apiserver.py), so its process series carry each its own pod;
- jaxmon-gone: a target nobody listens on.
So almost every alert fires for a known reason, and the rest are listed with why they stay quiet here. Prometheus
loads job.yml beside alerts.yml: the Utilization ladder row reads its records. job.yml's once-a-minute groups (the
per-process records its hour-long rules read) are evaluated every second here, as every other group is: the
trainer's three sampled traces come within seconds, and records a minute apart would see one of them (the compute
straggler rules want three) and leave the hour's rate() one point (placement advice) for a minute or more; nothing
else in the file is changed (deploy/prometheus/job_test.yml evaluates them once a minute).
"""

from __future__ import annotations

import functools
import json
import re
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.cgroup_tree import write_process
from tests.conftest import FIXTURES, ROOT, Daemon, free_port, wait_until
from tests.deploy_files import (
    DASHBOARDS,
    JOB_RULES,
    RULES,
    alert_rules,
    dashboard_targets,
    dashboard_variables,
    load_yaml,
    readme_metrics,
    recording_rules,
    variable_query,
)
from tests.fake_apiserver import FakeApiServer, pod_item
from tests.fake_kubelet import FakeKubelet, container, pod
from tests.fake_libtpu import MEGASCALE, Chip, Entry, FakeLibtpu, Timing, connection, sized
from tests.fake_libtpu import Scenario as LibtpuScenario
from tests.fakenvml import GPU_IS_LOST, Scenario, device, gpm, link, mig_device
from tests.helpers import Child
from tests.prometheus import Prometheus

SCRAPE_INTERVAL = 1.0
EVALUATION_INTERVAL = "1s"
PLACED = 1 << 20  # bytes of the trainer's replicated array, and of its pinned_host one
# $__rate_interval as Grafana computes it for a 1s scrape interval is 4s; 10s leaves room for a missed scrape.
RATE_INTERVAL = "10s"

# Alerts whose expression legitimately returns nothing in this setup (asserted empty), and why.
QUIET_ALERTS = {
    # jaxmon targets exist (six up, one down).
    "JaxmonExporterAbsent",
    # It watches accelerators (platform!="cpu") on a jaxmon where a workload reports: here only CPU devices are
    # probed, and the probing daemon has no workload (the spool sidecar runs without the probe).
    "JaxmonAcceleratorIdle",
    # The trainer stepped seconds ago (the threshold is 5 minutes at least), and there are no 6 hours of steps to
    # compare with.
    "JaxmonTrainingStalled",
    "JaxmonTrainingStepTimeRegression",
    # The fake libtpu's DCN transfers keep one latency, and there is no hour of history to compare with.
    "JaxmonTpuDcnTransferLatencyHigh",
    # CPU devices alone (whose collectives are a rendezvous of threads, nothing on a link): left out
    # (tests/e2e/test_profile.py has a loop that fires it without that filter; alerts_test.yml on GPUs).
    "JaxmonTrainingCommunicationBound",
    # The trainer's process is minutes old: its compilations are its warm-up, left out for 20 minutes (alerts_test.yml's
    # cases fire it on a process past them).
    "JaxmonRecompilationStorm",
    # No embedded exporter ends here (a spooled process that dies is JaxmonWorkloadStoppedReporting's), and no
    # process starts again (tests/e2e/test_churn.py has both, in real Prometheus servers).
    "JaxmonTrainingCrashed",
    "JaxmonTrainingRestarted",
}

# Identifying labels of what each other alert's expression must return, and why.
FIRING: dict[str, list[dict[str, str]]] = {
    "JaxmonExporterDown": [{"job": "jaxmon-gone"}],  # nobody listens there
    "JaxmonCollectorFailing": [
        {"job": "jaxmon-replay", "instance": "shapes", "collector": "memory"},  # gpu:6 raises
        {"job": "jaxmon-cpu", "collector": "probe"},  # cpu:3 hangs
    ],
    "JaxmonBackendDown": [{"job": "jaxmon-spool", "backend": "tpu"}],  # JAX_PLATFORMS=cpu,tpu without libtpu
    "JaxmonSpoolFilesRejected": [
        {"job": "jaxmon-spool", "reason": "bad_json"},  # the file the test drops
        {"job": "jaxmon-tpu", "reason": "bad_json"},  # the same spool
    ],
    "JaxmonDeviceDown": [{"job": "jaxmon-cpu", "platform": "cpu", "device": "3"}],  # its probe hangs
    "JaxmonDeviceMemoryUnreadable": [{"instance": "shapes", "platform": "gpu", "device": "6"}],  # device lost
    "JaxmonMemoryNearLimit": [
        {"instance": "shapes", "platform": "gpu", "device": "7"},  # bytes_in_use == bytes_limit
        {"instance": "demo", "platform": "gpu", "device": "7"},  # 58 of 60 GiB
    ],
    "JaxmonMemoryPeakNearLimit": [
        {"instance": "shapes", "platform": "gpu", "device": "7"},
        {"instance": "demo", "platform": "gpu", "device": "7"},  # peak 59.5 of 60 GiB
    ],
    "JaxmonMemoryFragmented": [{"instance": "demo", "platform": "gpu", "device": "4"}],  # 0.75, 13 % free
    "JaxmonLargestAllocatableLow": [
        {"instance": "shapes", "platform": "gpu", "device": "7"},  # nothing allocatable
        {"instance": "demo", "platform": "gpu", "device": "4"},  # 2 GiB
        {"instance": "demo", "platform": "gpu", "device": "7"},  # 1.5 GiB
    ],
    "JaxmonWorkloadStoppedReporting": [
        {"job": "jaxmon-spool", "workload": "ephemeral"},  # killed
        {"job": "jaxmon-tpu", "workload": "ephemeral"},
    ],
    # The trainer said it checkpoints every second (--checkpoint-interval), and its last checkpoint is older.
    "JaxmonTrainingCheckpointOverdue": [{"workload": "trainer"}],
    "JaxmonTpuIdle": [{"job": "jaxmon-tpu", "platform": "tpu", "device": "8", "source": "libtpu"}],  # 2 % duty cycle
    # The spool sidecar's tpu collector reads an address nobody listens on while its workloads report.
    "JaxmonTpuMetricsDown": [{"job": "jaxmon-spool", "collector": "tpu"}],
    # The fake NVML's GPUs (see nvml_scenario).
    # A lost GPU is this alert alone: the nvml collector still succeeds (NVML answers), so no JaxmonCollectorFailing.
    "JaxmonGpuLost": [{"job": "jaxmon-nvml", "device": "2"}],
    "JaxmonGpuHot": [{"job": "jaxmon-nvml", "device": "0"}],  # 91 °C
    "JaxmonGpuThrottled": [{"job": "jaxmon-nvml", "device": "0", "reason": "hw_thermal_slowdown"}],
    "JaxmonGpuPowerCapped": [{"job": "jaxmon-nvml", "device": "0", "reason": "sw_power_cap"}],
    "JaxmonGpuBusyButIdle": [{"job": "jaxmon-nvml", "device": "0"}],  # 97 % duty cycle, 12 % SM active
    "JaxmonGpuEccUncorrected": [{"job": "jaxmon-nvml", "device": "1", "kind": "uncorrected"}],
    "JaxmonGpuXidError": [{"job": "jaxmon-nvml", "device": "1", "xid": "79"}],
    # Per GPU: the errors are summed over its links unless --collector.nvml.nvlink-links.
    "JaxmonGpuNvlinkErrors": [{"job": "jaxmon-nvml", "device": "1", "kind": "replay"}],
    # Link 16 was up and went down; link 17 was never up (an unused link): not it.
    "JaxmonGpuNvlinkDown": [{"job": "jaxmon-nvml", "device": "1", "link": "16"}],
    "JaxmonGpuPcieReplays": [{"job": "jaxmon-nvml", "device": "1"}],
    "JaxmonGpuRowsRemappedUncorrectable": [{"job": "jaxmon-nvml", "device": "1", "kind": "uncorrectable"}],
    "JaxmonGpuRowRemapFailed": [{"job": "jaxmon-nvml", "device": "1"}],
    # The trainer stepped for a fraction of a second in the last minutes, with a peak of 1e12 FLOP/s per CPU device;
    # its last steps, seen by Prometheus, were mostly data loading (badput).
    "JaxmonTrainingGoodputLow": [{"workload": "trainer"}],
    "JaxmonTrainingMfuLow": [{"workload": "trainer"}],
    "JaxmonDeviceMemoryNearFull": [
        {"job": "jaxmon-nvml", "platform": "gpu", "device": "1"},  # 78 of 80 GiB
        {"job": "jaxmon-tpu", "platform": "tpu", "device": "9"},  # 97 % of its HBM (libtpu)
    ],
}

TPU_IDS = (8, 9, 12, 13)


# libtpu's monitoring SDK as the stand-in serves it: one TensorCore a chip (a percentage each), one entry a chip.
TPU_SDK = {
    "tensorcore_util": ["1.5", "40", "55.5", "70"],
    "hbm_capacity_total": [str(16 * (1 << 30))] * len(TPU_IDS),
}


def tpu_chips() -> dict[int, Chip]:
    """Chip 8 idles (2 % duty cycle), chip 9 has 97 % of its HBM in use; all serve every metric."""
    timing = Timing(counts=[0, 10, 30, 5], scale=100.0, growth=2.0, mean_us=210.0)
    return {
        dev: Chip(
            total_bytes=16 * (1 << 30),
            used_bytes=int(16 * (1 << 30) * (0.97 if dev == 9 else 0.5)),
            duty_cycle_pct=2.0 if dev == 8 else 60.0,
            hbm_util_pct=30.0,
            idle_s=0.0 if dev != 8 else 95.0,
            hlo_queue=3,
            timing=timing,
        )
        for dev in TPU_IDS
    }


def multislice_host() -> dict[str, list[Entry]]:
    """Every megascale metric, as a multi-slice job's libtpu serves them (two buffer sizes; two connections)."""
    host = {}
    for name in MEGASCALE:
        if "grpc_tcp" in name:
            host[name] = [connection(c, [0, 30, 20, 0], scale=50.0, mean=90.0) for c in range(2)]
        else:
            host[name] = [
                sized("8MB+", [0, 0, 60, 40, 0], scale=1000.0, mean=3500.0),
                sized("4MB+", [0, 80, 20, 0, 0], scale=1000.0, mean=1800.0),
            ]
    return host


# The sampled copies by direction: the trainer's devices are CPU devices, whose traces hold no device event for a
# copy (host events without a device or bytes), so none is split by direction (tests/unit/xla/test_cpu_trace.py);
# a GPU's memcpy events are split on built traces (tests/unit/xla/test_split_fakes.py, unit/training/test_sampler.py).
COPY_PANELS = {("Device-to-device copy bytes per step", "A"), ("Copy share by direction", "A")}
# Their families: no series here, so their selectors match nothing.
COPY_FAMILIES = {
    "jaxmon_training_profile_copy_bytes_total",
    "jaxmon_training_profile_copy_seconds_total",
}

# Dashboard queries that legitimately return nothing here (with All selected, the trainer as the one workload of
# the Job and JAX training dashboards), and why.
EMPTY_PANEL_QUERIES: dict[str, set[tuple[str, str]]] = {
    "jaxmon.json": {
        # The probe's estimate of a GPU jaxmon matched to a JAX device: JAX runs on CPU here, so no NVML GPU is
        # matched.
        ("The ladder, mean over the GPUs", "E"),
        ("Probe estimate", "A"),
        # The TPU ladder's MFU rung: the trainer beside the TPU sidecar runs on CPU devices, so no TPU MFU is
        # joined to a chip (deploy/prometheus/job_test.yml's cases record it).
        ("The ladder, mean over the TPU chips", "C"),
        ("MFU beside the chip", "A"),
        # No embedded exporter here (EMPTY_SELECTORS).
        ("Embedded exporter stopping", "A"),
        ("How embedded exporters' processes ended (1h)", "A"),
        *COPY_PANELS,
    },
    "jaxmon-fleet.json": {
        # The exporter down is jaxmon-gone's, a job that never served jaxmon_build_info, so $job does not list it
        # (a jaxmon job whose members are all down drops out of $job the same way, as on the main dashboard).
        ("Exporters and devices down", "A"),
        ("The ladder, mean over the GPUs", "E"),
        ("Probe estimate", "A"),
        ("The ladder, mean over the TPU chips", "C"),
        ("MFU beside the chip", "A"),
    },
    # The trainer's memory: its devices are CPU devices, whose allocator keeps no statistics (no bytes in use,
    # limit or headroom); its live arrays (the replicated one on every device) give the memory skew, and its
    # programs' predicted peak has no limit to stand beside. Its alerts (JaxmonTrainingGoodputLow,
    # JaxmonTrainingMfuLow) are pending, not firing, for the length of this test.
    "jaxmon-job.json": {("Job alerts", "A"), *COPY_PANELS},
    "jaxmon-training.json": {
        ("Least OOM headroom", "A"),
        ("Fullest devices (in use / limit)", "A"),
        ("Predicted peak memory beside the limit", "B"),
        ("Predicted peak / limit: the fullest devices", "A"),
    },
}
# What the single-valued variables (the workload of the Job and JAX training dashboards) are set to.
ONE_VALUE = {"workload": "trainer"}
NODE = "node-a"
# GPU 0's processes 4100, 4101, 4102 (SM 60 %, 25 %, 5 %): (namespace, pod, container, pod UID, container id).
GPU0_PODS = [
    ("team-a", "train-0", "trainer", "7c9e6679-7425-40de-944b-e07fc1f90ae7", "a1" * 32),
    ("team-b", "notebook", "jupyter", "0f8fad5b-d9cb-469f-a165-70867728950e", "b2" * 32),
    ("team-c", "infer", "server", "16fd2706-8baf-433b-82eb-8c7fada847da", "c3" * 32),
]
MAX_SERIES = 50

# Vector selectors (of dashboard or alert queries) that legitimately match no series here, and why.
EMPTY_SELECTORS = {
    # Accelerators only: this machine's probed devices are all CPU devices.
    'jaxmon_device_utilization_ratio{platform!="cpu"}',
    # NVML's GPUs matched to JAX devices: the fake NVML's daemon has CPU devices, so its GPUs are labelled by NVML
    # index. The match, and the alerts' join through it, are tests/e2e/test_alertmanager.py's and alerts_test.yml's.
    'jaxmon_device_info{source="nvml", device_match!="nvml_index"}',
    # JaxmonTrainingCommunicationBound's: the trainer's devices are CPU devices.
    'jaxmon_training_profile_seconds_total{part="collective", platform!="cpu"}',
    'jaxmon_training_profiled_seconds_total{platform!="cpu"}',
}
# Families only an embedded exporter (jaxmon.start()) serves, and none runs here: their selectors match nothing.
# tests/e2e/test_prometheus_truth.py scrapes embedded loops that finish, crash and restart.
EMBEDDED_ONLY = {"jaxmon_exporter_stopping", "jaxmon_exporter_exit_info"}

SELECTOR = re.compile(r'\b((?:jaxmon_[a-z0-9_]+|up|scrape_duration_seconds)(?:\{(?:[^}"]|"(?:[^"\\]|\\.)*")*\})?)')


@dataclass
class Stack:
    prometheus: Prometheus
    instances: dict[str, str]  # short name -> instance label (host:port)

    def named(self, labels: dict[str, str]) -> dict[str, str]:
        """Labels with the instance written by its short name (shapes, demo, cpu, spool, nvml, gone)."""
        by_address = {v: k for k, v in self.instances.items()}
        return {k: by_address.get(v, v) if k == "instance" else v for k, v in labels.items()}


def nvml_scenario(path: Path) -> Scenario:
    """Four GPUs with something for every GPU alert and panel; the Xid event and the rising error counters come
    once the daemon runs (nvml_events)."""
    gib = 1 << 30
    mig = [
        mig_device(3, 0, "1g.18gb", 9),
        mig_device(3, 1, "3g.71gb", 2, utilization={"gpu": 45, "memory": 12}),
    ]
    return Scenario(
        path,
        [
            device(
                0,
                temperature_c=91,
                clocks_event_reasons=0x4 | 0x40,
                utilization={"gpu": 97, "memory": 60},
                fans=[60, 65],
                gpm=gpm(0, sm_active=12.0),
                # Time-sliced by three processes, each with its own SM, memory, encoder and decoder share.
                processes=[
                    {"pid": 4100 + n, "used": (n + 1) * gib, "utilization": {"sm": sm, "memory": 9, "decoder": n}}
                    for n, sm in enumerate((60, 25, 5))
                ],
            ),
            device(
                1,
                memory={"total": 80 * gib, "reserved": 0, "used": 78 * gib},
                ecc={"enabled": True, "corrected": 4, "uncorrected": 2},
                processes=[{"pid": 4242, "used": 77 * gib}],
                remapped_rows={"correctable": 1, "uncorrectable": 0, "pending": False, "failure": True},
                nvlink=[link(1, n, active=n != 17) for n in range(18)],
            ),
            device(2, error=GPU_IS_LOST),
            device(
                3,
                mig={"current": 1, "pending": 1, "max_devices": 7, "devices": mig},
                not_supported=["utilization"],
                # More processes than --collector.nvml.max-processes (16): the rest are counted together.
                processes=[{"pid": 5000 + n, "used": (n + 1) << 20} for n in range(20)],
            ),
        ],
    )


def nvml_events(scenario: Scenario) -> None:
    """What the GPU alerts watch for, after Prometheus has the counters' earlier values: GPU 1 gets an Xid 79,
    three replays on NVLink 4, NVLink 16 down (17 never came up), five PCIe replays and a row remapped for an
    uncorrectable error."""
    scenario.xid(1, 79)
    links = [link(1, n, active=n not in (16, 17)) for n in range(18)]
    links[4] = link(1, 4, replay=3)
    remapped = {"correctable": 1, "uncorrectable": 1, "pending": True, "failure": True}
    scenario.update(1, nvlink=links, pcie={"tx_kbps": 2000, "rx_kbps": 4000, "replays": 5}, remapped_rows=remapped)


def _equals(value: float, result: list[dict[str, Any]]) -> bool:
    return _value(result) == value


def _timestamp(rfc3339: str) -> float:
    """Seconds since the epoch of a timestamp as Prometheus's API writes them (nanoseconds, or 0001-01-01 for never)."""
    when = re.sub(r"(\.\d{6})\d*", r"\1", rfc3339).replace("Z", "+00:00")
    return datetime.fromisoformat(when).timestamp()


def _value(result: list[dict[str, Any]]) -> float:
    return float(result[0]["value"][1]) if result else float("nan")


def every_evaluation(tmp: Path) -> Path:
    """job.yml with its groups of their own interval (the once-a-minute records) at the stack's evaluation interval,
    nothing else changed."""
    text = JOB_RULES.read_text(encoding="utf-8")
    own = [g["name"] for g in load_yaml(JOB_RULES)["groups"] if "interval" in g]
    text, n = re.subn(r"^(\s+)interval: \S+$", rf"\1interval: {EVALUATION_INTERVAL}", text, flags=re.MULTILINE)
    assert own and n == len(own), (own, n)
    path = tmp / JOB_RULES.name
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("prometheus")
    spool = tmp / "spool"
    faults = tmp / "faults.json"
    daemons: list[Daemon] = []
    children: list[Child] = []
    prometheus: Prometheus | None = None
    libtpu = FakeLibtpu(LibtpuScenario(chips=tpu_chips(), host=multislice_host())).start()
    # The nvml daemon's kubelet: a pod holds GPU 0, by the UUID the fake NVML gives it.
    kubelet = FakeKubelet([pod("team-a", "train-0", container("trainer", {"nvidia.com/gpu": [device(0)["uuid"]]}))])
    # The node's pods (the API server's): GPU 0's processes 4100-4102 are the trainer's and two other pods' that use
    # GPU 0 without the kubelet knowing (NVIDIA_VISIBLE_DEVICES=all), each named by its cgroup (below).
    apiserver = FakeApiServer(
        [], [pod_item(NODE, ns, name, uid, {ctr: f"containerd://{cid}"}) for ns, name, ctr, uid, cid in GPU0_PODS]
    )
    try:
        kubelet.start()
        apiserver.start()
        shapes = Daemon(tmp, ["--replay", str(FIXTURES / "shapes.json"), "--poll.interval", "1s"])
        daemons.append(shapes)
        demo = Daemon(tmp, ["--replay", str(ROOT / "deploy" / "demo" / "replay.json"), "--poll.interval", "1s"])
        daemons.append(demo)
        cpu_args = [
            "--collector.probe.interval",
            "1s",
            "--collector.probe.size",
            "64",
            "--collector.probe.timeout",
            "2s",
            "--poll.interval",
            "1s",
            "--collector.probe.each-cpu-device",  # eight probes, so that one hangs alone
        ]
        cpu = Daemon(tmp, cpu_args, env={"JAXMON_FAULTS_FILE": str(faults)})
        daemons.append(cpu)
        spool_args = [
            "--no-collector.probe",
            "--collector.spool.dir",
            str(spool),
            "--collector.spool.ttl",
            "3s",
            "--poll.interval",
            "0.5s",
        ]
        nobody = f"127.0.0.1:{free_port()}"
        sidecar = Daemon(
            tmp, [*spool_args, "--collector.tpu", "--collector.tpu.address", nobody], env={"JAX_PLATFORMS": "cpu,tpu"}
        )
        daemons.append(sidecar)
        # The TPU sidecar's libtpu monitoring SDK: the stand-in package (tests/sdk_standin) on its path, for its SDK
        # child; the sidecar's own JAX runs on CPU beside the job that holds the chips, as a real one does.
        sdk_scenario = tmp / "sdk.json"
        sdk_scenario.write_text(json.dumps({"metrics": TPU_SDK}))
        tpu = Daemon(
            tmp,
            [*spool_args, "--collector.tpu", "--collector.tpu.address", libtpu.address],
            env={
                "PYTHONPATH": str(ROOT / "tests" / "sdk_standin"),
                "JAXMON_TEST_SDK_SCENARIO": str(sdk_scenario),
                "JAX_PLATFORMS": "cpu",
            },
        )
        daemons.append(tpu)
        scenario = nvml_scenario(tmp / "nvml.json")
        nvml_args = ["--no-collector.probe", "--collector.nvml", "--collector.nvml.gpm-pipes"]
        nvml_args += ["--poll.interval", "0.5s"]
        nvml_args += ["--collector.kubernetes", "--collector.kubernetes.socket", str(kubelet.socket)]
        # GPU 1's process is job 31337's (cgroup v2), in a procfs of the test's: jaxmon_slurm_job_device_info.
        write_process(tmp / "proc", 4242, "0::/system.slice/slurmstepd.scope/job_31337/step_0/user/task_0\n")
        nvml_args += ["--collector.slurm", "--path.procfs", str(tmp / "proc")]
        for n, (_, _, _, uid, cid) in enumerate(GPU0_PODS):
            slice_ = f"kubepods-besteffort-pod{uid.replace('-', '_')}.slice"
            path = f"/kubepods.slice/kubepods-besteffort.slice/{slice_}/cri-containerd-{cid}.scope"
            write_process(tmp / "proc", 4100 + n, f"0::{path}\n")
        # The API server first answers 503 (a failed list of each: jaxmon_kubernetes_api_failures_total), then
        # lists every second.
        apiserver.update(status=503)
        nvml_args += ["--collector.kubernetes.service-account", str(apiserver.account)]
        nvml_args += ["--collector.kubernetes.resourceslice-interval", "1s"]
        nvml = Daemon(tmp, nvml_args, env={**scenario.env(), **apiserver.env, "NODE_NAME": NODE})
        daemons.append(nvml)
        # The children finish their start-up compilations before Prometheus sees them, so that the only
        # compilations it watches are the ones this test asks for.
        for name in ("trainer", "ephemeral"):
            # The trainer runs in the pod that holds the nvml daemon's GPU 0 (as the Downward API would say).
            env = {"POD_NAME": "train-0", "POD_NAMESPACE": "team-a"} if name == "trainer" else None
            child = Child(
                tmp,
                "publish",
                "--spool",
                str(spool),
                "--workload",
                name,
                "--interval",
                "0.3",
                "--peak-flops",
                "1e12",
                "--profile-every",
                "4",
                # CPU devices have no nominal link figures in jaxmon's table: the setting gives them some, so that
                # the nominal bandwidth family and its panels have data.
                "--link-bandwidth",
                "local=1e10,network=1.25e9",
                # The interval the job says it checkpoints at (every second: it is soon overdue), so that its
                # families, panels and alert have data.
                "--checkpoint-interval",
                "1s,100",
                env=env,
            )
            children.append(child)
            child.send("train 2")
        trainer, ephemeral = children
        # The trainer reports steps (jaxmon.step), then restarts from an earlier one: every training family has data.
        trainer.send("steps 6 5")
        trainer.send("restore 2")
        trainer.send("steps 3")
        trainer.send("checkpointed 4")  # a checkpoint of step 4, as a checkpointer other than Orbax says it
        # Placement through the spool (schema 3): 1 MiB replicated on each device, 1 MiB of pinned_host over all 8.
        trainer.send(f"replicate {PLACED}")
        trainer.send(f"offload pinned_host {PLACED}")
        for d in daemons:
            d.wait_ready()
        wait_until(lambda: len(apiserver.calls()) >= 2, timeout=30, what="the nvml daemon's first API server lists")
        apiserver.update(status=None)
        instances = {
            "shapes": f"127.0.0.1:{shapes.port}",
            "demo": f"127.0.0.1:{demo.port}",
            "cpu": f"127.0.0.1:{cpu.port}",
            "spool": f"127.0.0.1:{sidecar.port}",
            "tpu": f"127.0.0.1:{tpu.port}",
            "nvml": f"127.0.0.1:{nvml.port}",
            "gone": f"127.0.0.1:{free_port()}",
        }
        config = {
            "global": {
                "scrape_interval": f"{SCRAPE_INTERVAL:g}s",
                "scrape_timeout": f"{SCRAPE_INTERVAL:g}s",
                "evaluation_interval": EVALUATION_INTERVAL,
            },
            "rule_files": [str(RULES), str(every_evaluation(tmp))],
            "scrape_configs": [
                {
                    "job_name": "jaxmon-replay",
                    "static_configs": [{"targets": [instances["shapes"], instances["demo"]]}],
                },
                {"job_name": "jaxmon-cpu", "static_configs": [{"targets": [instances["cpu"]]}]},
                {"job_name": "jaxmon-spool", "static_configs": [{"targets": [instances["spool"]]}]},
                {"job_name": "jaxmon-tpu", "static_configs": [{"targets": [instances["tpu"]]}]},
                {"job_name": "jaxmon-nvml", "static_configs": [{"targets": [instances["nvml"]]}]},
                {"job_name": "jaxmon-gone", "static_configs": [{"targets": [instances["gone"]]}]},
            ],
        }
        prometheus = Prometheus(tmp, config)
        prometheus.wait_ready()
        started = time.monotonic()
        p = prometheus
        p.wait_for("sum(up)", lambda r: _value(r) == 6, "six targets up")
        p.wait_for("count(up == 0)", lambda r: _value(r) == 1, "the dead target down")
        p.wait_for(
            'count(jaxmon_probe_duration_seconds{job="jaxmon-cpu"})', lambda r: _value(r) == 8, "probes on 8 devices"
        )
        p.wait_for(
            'count(jaxmon_workload_last_report_timestamp_seconds{job="jaxmon-spool"})',
            lambda r: _value(r) == 2,
            "both workloads",
        )
        p.wait_for('count(jaxmon_device_source_up{job="jaxmon-tpu"} == 1)', lambda r: _value(r) == 4, "four TPU chips")
        trainer_spool = 'job="jaxmon-spool", workload="trainer"'
        p.wait_for(
            f"count(jaxmon_memory_replicated_array_bytes{{{trainer_spool}}} == {PLACED})",
            lambda r: _value(r) == 8,
            "the trainer's replicated array on its 8 devices, through the spool",
        )
        p.wait_for(
            f'count(jaxmon_memory_host_array_bytes{{{trainer_spool}, memory_kind="pinned_host"}} == {PLACED // 8})',
            lambda r: _value(r) == 8,
            "the trainer's pinned_host array, an eighth on each device, through the spool",
        )
        p.wait_for(
            'jaxmon_spool_rejected_files_total{job="jaxmon-spool", reason="bad_json"}',
            lambda r: len(r) == 1,
            "rejection counter",
        )
        compiled = p.query('jaxmon_jit_compilations_total{job="jaxmon-spool", workload="trainer"}')
        assert compiled, "no compile counter"
        before = _value(compiled)
        # The trainer's first sampled trace (step 4, before Prometheus started) recorded by both sidecars: the first of
        # the three samples the compute straggler rules want (below: steps 8 and 12). Its parse can finish after
        # Prometheus's first scrapes.
        p.wait_for(
            'jaxmon:training_profile_sample_step:process1m{workload="trainer"} == 4',
            lambda r: len(r) == 2,
            "the sampled step 4 recorded from both sidecars",
        )

        # Now the events the alerts are about.
        faults.write_text(json.dumps({"probe_delay_seconds": {"cpu:3": 600}}))
        assert trainer.send("compile 40") == {"compiled": 40}
        # 4 steps after 200 ms of badput("data") each: goodput far under a half; each with a small all-reduce, and step
        # 8 traced (profile.every 4): its exposed collective share is far under JaxmonTrainingCommunicationBound's.
        trainer.send("steps 4 200 1")
        # The sample of step 8 recorded (by both sidecars) before step 12's replaces it: the compute straggler rules
        # compare a process that has three samples in the hour (steps 4, 8 and 12), and the two traces can come
        # within a second of each other, between two scrapes, unless the stack waits.
        p.wait_for(
            'jaxmon:training_profile_sample_step:process1m{workload="trainer"} == 8',
            lambda r: len(r) == 2,
            "the sampled step 8 recorded from both sidecars",
        )
        # Then a program that all-reduces over a mesh axis: collective bytes (after the sampled step 8, whose number
        # the steps before it set), its steps 9 to 12, step 12 traced: the sampled collectives by axis and link.
        trainer.send("collective 4")
        # Then steps 13 and 14 hand jaxmon.step() a scalar loss: the loss gauge and its step (issue 42).
        trainer.send("losses 2")
        (spool / "broken.json").write_text('{"schema": "jaxmon.spool/1", "devices": [')
        ephemeral.close()
        nvml_events(scenario)
        p.wait_for('jaxmon_device_xid_errors_total{job="jaxmon-nvml", xid="79"}', lambda r: _value(r) == 1, "Xid 79")
        for counter, value in (
            ('jaxmon_device_nvlink_errors_total{job="jaxmon-nvml", device="1", kind="replay"}', 3),
            ('jaxmon_device_pcie_replays_total{job="jaxmon-nvml", device="1"}', 5),
            ('jaxmon_device_remapped_rows_total{job="jaxmon-nvml", device="1", kind="uncorrectable"}', 1),
        ):
            p.wait_for(counter, functools.partial(_equals, value), counter)
        p.wait_for('jaxmon_device_up{job="jaxmon-cpu", device="3"}', lambda r: _value(r) == 0, "cpu:3 down")
        p.wait_for(
            'jaxmon_training_steps_total{job="jaxmon-spool", workload="trainer"}', lambda r: _value(r) >= 13, "13 steps"
        )
        p.wait_for(
            'jaxmon_training_profile_collective_seconds_total{job="jaxmon-spool", workload="trainer", op="all-reduce", '
            'axes=""}',
            lambda r: len(r) == 8,
            "the sampled trace of step 8, through the spool",
        )
        p.wait_for(  # the tracked program's all-reduce over "data", within one process: local
            'jaxmon_training_profile_collective_bytes_total{job="jaxmon-spool", workload="trainer", op="all-reduce", '
            'axes="data", link="local"}',
            lambda r: len(r) == 8 and all(_value([x]) > 0 for x in r),
            "the sampled trace of step 12 by axis and link, through the spool",
        )
        p.wait_for(
            'jaxmon_jit_compilations_total{job="jaxmon-spool", workload="trainer"}',
            lambda r: _value(r) >= before + 40,
            "40 compilations",
        )
        for job in ("jaxmon-spool", "jaxmon-tpu"):  # both sidecars read the spool
            p.wait_for(
                f'jaxmon_spool_rejected_files_total{{job="{job}", reason="bad_json"}}', lambda r: _value(r) >= 1, job
            )
        p.wait_for(
            'jaxmon_workload_last_report_timestamp_seconds{workload="ephemeral"}', lambda r: not r, "ephemeral gone"
        )
        # Every series has been scraped for a full rate() window: the ones the events above created (the Xid
        # counter, the second sidecar's rejection counter) hold at least three samples in the window, and the ones
        # that went away (the ephemeral workload's) have left it. A busy machine can reach this point a scrape after
        # the newest series appeared, where increase() over it would still be empty.
        time.sleep(max(0.0, started + float(RATE_INTERVAL[:-1]) - time.monotonic()))
        p.wait_for(
            f'{{job=~"jaxmon-.+"}}[{RATE_INTERVAL}]',  # every sample in the window, series by series
            lambda r: min(len(series["values"]) for series in r) >= 3,
            "every series scraped three times in the rate window",
        )
        # Every rule evaluated since then (a rule's health is "unknown" until its group's first evaluation; the
        # dashboards read records of the rate window's data).
        since = time.time()
        unevaluated: list[str] = []

        def evaluated() -> bool:
            unevaluated[:] = [
                rule["name"]
                for group in p.api("rules")["groups"]
                for rule in group["rules"]
                if rule["health"] == "unknown" or _timestamp(rule["lastEvaluation"]) < since
            ]
            return not unevaluated

        wait_until(evaluated, timeout=30, what="every rule evaluated", step=0.25, detail=lambda: str(unevaluated))
        yield Stack(prometheus, instances)
    finally:
        if prometheus is not None:
            prometheus.stop()
        for c in children:
            c.close()
        for d in daemons:
            d.stop(signal.SIGKILL)
        libtpu.stop()
        kubelet.close()
        apiserver.close()


# --------------------------------------------------------------------------------------------------------------
# Dashboard variables, emulating Grafana: "All" is the variable's allValue, or else the alternation of its values.
# --------------------------------------------------------------------------------------------------------------


def grafana_regex_escape(value: str) -> str:
    """Grafana's escaping of a value inside a PromQL regex string (the backslash doubled for the string)."""
    return re.sub(r"[$^*{}\[\]'+?.()|\\]", lambda m: "\\\\" + m.group(0), value)


def substitute(expr: str, values: dict[str, str]) -> str:
    out = expr.replace("${__rate_interval}", RATE_INTERVAL).replace("$__rate_interval", RATE_INTERVAL)
    out = out.replace("$__range", "10m")
    for name in sorted(values, key=len, reverse=True):
        out = out.replace("${" + name + "}", values[name]).replace("$" + name, values[name])
    assert "$" not in out, f"unsubstituted variable in {out}"
    return out


def label_values(p: Prometheus, query: str) -> list[str]:
    """What Grafana asks Prometheus for `label_values(selector, label)`: the label's values over the time range."""
    m = re.fullmatch(r"label_values\((.*),\s*([a-zA-Z_][a-zA-Z0-9_]*)\)", query.strip())
    assert m, f"not a label_values() query: {query}"
    now = time.time()
    values: list[str] = p.api(f"label/{m.group(2)}/values", **{"match[]": m.group(1), "start": now - 3600, "end": now})
    return values


def resolve_variables(
    p: Prometheus, path: Path = DASHBOARDS[0].parent / "jaxmon.json"
) -> tuple[dict[str, str], dict[str, list[str]]]:
    """Every query variable with "All" selected (a single-valued one: ONE_VALUE), in dashboard order (later ones use
    earlier ones)."""
    selected: dict[str, str] = {}
    listed: dict[str, list[str]] = {}
    for v in dashboard_variables(path):
        if v["type"] == "custom":  # k: its default
            selected[v["name"]] = v["current"]["value"]
        if v["type"] != "query":
            continue
        values = label_values(p, substitute(variable_query(v), selected))
        listed[v["name"]] = values
        if not v["multi"]:
            assert ONE_VALUE[v["name"]] in values, (v["name"], values)
            selected[v["name"]] = ONE_VALUE[v["name"]]
        elif "allValue" in v:
            selected[v["name"]] = v["allValue"]
        else:
            assert values, f"variable {v['name']} lists nothing"
            selected[v["name"]] = "(" + "|".join(grafana_regex_escape(x) for x in values) + ")"
    return selected, listed


def test_dashboard_variables_list_what_is_scraped(stack: Stack) -> None:
    _, listed = resolve_variables(stack.prometheus)
    assert set(listed["job"]) == {"jaxmon-replay", "jaxmon-cpu", "jaxmon-spool", "jaxmon-tpu", "jaxmon-nvml"}
    instances = ("shapes", "demo", "cpu", "spool", "tpu", "nvml")
    assert set(listed["instance"]) == {stack.instances[k] for k in instances}
    assert set(listed["platform"]) == {"gpu", "tpu", "cpu"}
    # JAX's devices, and the TPU chips only libtpu sees (jaxmon_device_source_up).
    assert set(listed["device"]) == {str(i) for i in range(9)} | {str(i) for i in TPU_IDS}
    assert {"trainer", "ephemeral"} <= set(listed["workload"])


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_every_dashboard_query_parses_and_returns_series(stack: Stack, path: Path) -> None:
    """Every panel query of every dashboard returns data, and at most 50 series (tests/unit/test_deploy.py holds
    them to a bound whatever the fleet's size; here, on a few dozen devices, the count is checked for real)."""
    values, _ = resolve_variables(stack.prometheus, path)
    empty = []
    for title, ref, expr in dashboard_targets(path):
        result = stack.prometheus.query(substitute(expr, values))
        if not result:
            empty.append((title, ref))
        assert len(result) <= MAX_SERIES, (title, ref, len(result))
    assert set(empty) == EMPTY_PANEL_QUERIES[path.name], f"panel queries without data: {empty}"


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_dashboard_queries_parse_with_one_value_of_each_variable(stack: Stack, path: Path) -> None:
    """A concrete selection (the first value of every variable) must still be valid PromQL everywhere."""
    p = stack.prometheus
    selected: dict[str, str] = {}
    for v in dashboard_variables(path):
        if v["type"] == "custom":
            selected[v["name"]] = v["current"]["value"]
        if v["type"] == "query":
            values = label_values(p, substitute(variable_query(v), selected)) or [""]
            selected[v["name"]] = grafana_regex_escape(values[0])
    for _title, _ref, expr in dashboard_targets(path):
        p.query(substitute(expr, selected))


def test_every_alert_expression_returns_what_it_should(stack: Stack) -> None:
    names = {rule["alert"] for rule in alert_rules()}
    assert names == set(FIRING) | QUIET_ALERTS, "every alert must be listed as firing or quiet here"
    for rule in alert_rules():
        result = stack.prometheus.query(rule["expr"])
        name = rule["alert"]
        if name in QUIET_ALERTS:
            assert result == [], f"{name} should stay quiet here: {result}"
            continue
        got = [stack.named(r["metric"]) for r in result]
        for want in FIRING[name]:
            assert [g for g in got if want.items() <= g.items()], f"{name}: no series with {want} in {got}"
        for g in got:
            assert any(w.items() <= g.items() for w in FIRING[name]), f"{name}: unexpected series {g}"


def test_prometheus_loaded_the_rules_and_evaluates_them_without_error(stack: Stack) -> None:
    p = stack.prometheus
    loaded = {}
    for group in p.api("rules")["groups"]:
        for rule in group["rules"]:
            loaded[rule["name"]] = rule
    shipped = {r["alert"] for r in alert_rules()}
    job = {r["alert"] for r in alert_rules(JOB_RULES)} | {r["record"] for r in recording_rules(JOB_RULES)}
    assert set(loaded) == shipped | {r["record"] for r in recording_rules(RULES)} | job
    for name, rule in loaded.items():
        assert rule["health"] == "ok", f"{name}: {rule.get('lastError')}"
    # Alerts become pending (all have a for: duration) within an evaluation or two. (job.yml's are its own tests'.)
    active: set[str] = set()

    def all_active() -> bool:
        active.clear()
        active.update(
            a["labels"]["alertname"] for a in p.api("alerts")["alerts"] if a["state"] in ("pending", "firing")
        )
        return active & shipped == set(FIRING)

    wait_until(all_active, timeout=10, what="every alert pending", step=0.5, detail=lambda: f"active: {sorted(active)}")


def test_every_selector_matches_series(stack: Stack) -> None:
    """Each metric selector of every dashboard query and alert must match series: a renamed metric or a misspelt
    label matcher that would leave a quiet alert forever quiet fails here."""
    values, _ = resolve_variables(stack.prometheus)
    exprs = [substitute(e, values) for _, _, e in dashboard_targets()] + [r["expr"] for r in alert_rules()]
    selectors = {m for e in exprs for m in SELECTOR.findall(e)}
    now = time.time()
    unmatched = set()
    for selector in sorted(selectors):
        series = stack.prometheus.api("series", **{"match[]": selector, "start": now - 600, "end": now})
        if not series:
            unmatched.add(selector)
    assert {u for u in unmatched if u.split("{")[0] not in EMBEDDED_ONLY | COPY_FAMILIES} == EMPTY_SELECTORS


def test_every_readme_metric_family_reaches_prometheus(stack: Stack) -> None:
    names = set(stack.prometheus.api("label/__name__/values"))
    missing = set(readme_metrics()) - names - EMBEDDED_ONLY - COPY_FAMILIES
    assert not missing, f"families the setup does not produce (so their panels are untested): {sorted(missing)}"


def test_the_ladder_records_each_gpus_rungs(stack: Stack) -> None:
    """job.yml's ladder records on the fake's GPUs: the tensor activity of GPU 0 (60.5 %) at its full SM clock, of
    GPU 1 (59.5 %) at 1979 of 1980 MHz, of GPU 3 (57.5 %, whole, in MIG mode) at 1977; and the MFU beside GPU 0 is
    the trainer's, found through the pod that holds GPU 0 (a node-mode GPU: by process, not by device). No other GPU
    serves a workload."""
    p = stack.prometheus
    query = 'jaxmon:device_model_flops_utilization_ratio{job="jaxmon-nvml"}'
    p.wait_for(query, bool, "the MFU beside GPU 0", timeout=30)
    (mfu,) = p.query(query)
    labels = mfu["metric"]
    assert (labels["device"], labels["workload"], labels["join"], labels["pod"]) == (
        "0",
        "trainer",
        "process",
        "train-0",
    )
    trainer = p.query('avg(jaxmon_training_model_flops_utilization_ratio{job="jaxmon-spool", workload="trainer"})')
    assert float(mfu["value"][1]) == pytest.approx(_value(trainer), rel=1e-6)
    tensor = p.query('jaxmon:device_tensor_active_ratio:clock_adjusted{job="jaxmon-nvml", gpu_instance=""}')
    by_device = {r["metric"]["device"]: float(r["value"][1]) for r in tensor}
    assert by_device == pytest.approx({"0": 0.605, "1": 0.595 * 1979 / 1980, "3": 0.575 * 1977 / 1980}), by_device


def test_the_tpu_ladder_records_each_chips_tensorcore_rung(stack: Stack) -> None:
    """job.yml's TPU ladder on the TPU sidecar's chips: each chip's TensorCore utilization, the SDK's percentage
    (the stand-in's, one core a chip, in the order of libtpu's device-ids) as a ratio. The trainer there runs on
    CPU devices, so no TPU MFU is joined (job_test.yml's cases join it)."""
    p = stack.prometheus
    query = 'jaxmon:device_tensorcore_utilization_ratio:chip{job="jaxmon-tpu"}'
    p.wait_for(query, lambda r: len(r) == len(TPU_IDS), "four chips' TensorCore rung", timeout=30)
    got = {r["metric"]["device"]: float(r["value"][1]) for r in p.query(query)}
    want = {str(dev): float(pct) / 100 for dev, pct in zip(TPU_IDS, TPU_SDK["tensorcore_util"], strict=True)}
    assert got == pytest.approx(want), got
    assert not p.query('jaxmon:device_model_flops_utilization_ratio{platform="tpu"}')
    status = p.query('jaxmon_libtpu_sdk_status{job="jaxmon-tpu"} == 1')
    assert [r["metric"]["status"] for r in status] == ["ok"]


def test_the_fleet_sm_by_pod_panel_names_each_pod_using_the_time_sliced_gpu(stack: Stack) -> None:
    """The fleet dashboard's "SM use by pod" panel on GPU 0, which three pods' processes share: one line per pod,
    its own processes' SM share (each process's series carries its pod: its cgroup, the API server's pods)."""
    fleet = DASHBOARDS[0].parent / "jaxmon-fleet.json"
    values, _ = resolve_variables(stack.prometheus, fleet)
    (expr,) = [e for title, _, e in dashboard_targets(fleet) if title.startswith("SM use by pod")]
    expected = {("team-a", "train-0"): 0.60, ("team-b", "notebook"): 0.25, ("team-c", "infer"): 0.05}
    got: dict[tuple[str, str], float] = {}

    def per_pod(result: list[dict[str, Any]]) -> bool:
        got.clear()
        got.update({(r["metric"]["namespace"], r["metric"]["pod"]): float(r["value"][1]) for r in result})
        return got.keys() == expected.keys()

    stack.prometheus.wait_for(substitute(expr, values), per_pod, "one line per pod on GPU 0", timeout=30)
    assert got == pytest.approx(expected)
