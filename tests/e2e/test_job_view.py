"""The job view end to end: deploy/prometheus/job.yml in a real Prometheus, over a real multi-process JAX job.

- The job: four processes of tests/workloads/job.py joined by jax.distributed (CPU devices, gloo collectives on
  loopback), each step a cross-process reduction, each process with jaxmon embedded (its probe off: four CPU
  "devices" sharing this machine's two cores say nothing about device speed; the NVML fake below does). The tests
  make process 2 host-bound (a delay before each dispatch) and then stall process 3 (it stops dispatching and
  keeps serving), and the rules must name that process and no other.
- The devices, in the two shapes the rules join: a node-mode jaxmon (no JAX) reading the NVML fake's eight GPUs, one
  of them clocked down by a thermal slowdown, and the spool of a workload publishing from those eight GPUs whose
  memory is skewed onto one of them (the sidecar's shape: the GPUs serve the workload that reports to their jaxmon;
  this machine has no GPU for JAX, so the test writes the spool documents such a publisher writes, with jaxmon's own
  spool codec, as the NVML fake stands in for the driver); and the job's own GPUs
  as a DaemonSet serves them: a second node-mode jaxmon, with its own NVML fake of six GPUs and the fake kubelet
  (tests/fake_kubelet.py) saying which pod holds each (process i's pod llama-i holds GPU 3-i; GPU 4 is another
  pod's, GPU 5 nobody's), while each process exports its pod and namespace (POD_NAME and POD_NAMESPACE, as the
  Downward API sets them). The rules join those GPUs to the job through the pods: one clocked down is the job's
  straggler, the job's energy per step is theirs, and a kubelet outage (the fake stopped, its socket gone, then
  started again) fires no alert; then one at full clock whose SMs are active less of the time (GPM) is the job's
  straggler by SM activity, and no other GPU is.
- The job takes sampled traces (every 8 steps, at most one each 2 s), so each device exports its collective wait in
  the last sample: then process 1's device is made slow inside the jitted step (a loop of matmuls before the step's
  cross-process reduction that turns only in that process: tests/workloads/job.py says why not a host callback that
  sleeps), and JaxmonTrainingComputeStraggler must name process 1 and no other while the host-wait rule stays
  quiet; it stays quiet for process 2's host-bound delay before it.
- Prometheus scrapes every second and evaluates the shipped rules with their 5-minute windows shortened to 15 s,
  their hour-long ones (the sampled traces') to 20 s and the once-a-minute records they read to every second, their
  `for:` to 4 s, the stall parameter to 6 s and the compute straggler's gap to 0.3 of the step (from 0.1: four
  processes time-sharing two cores beside other load give one of them less CPU for a while, a real compute
  straggler by the rule's measure, 0.1-0.2 of the step in 20 s; the slowed device's gap is over 0.8); nothing else
  in them is changed. alerts.yml is loaded beside them
  with its `for:` at 4 s and JaxmonTrainingStalled's 300 s floor at 10 s (above the stall parameter, as in the
  shipped files), so that a stall shows its one page: JaxmonTrainingProcessStalled for the culprit, and no
  JaxmonTrainingStalled beside it; and with JaxmonTrainingCommunicationBound off (four processes of gloo
  collectives time-sharing two cores wait on one another in their collectives, which a sample rightly calls
  communication-bound; tests/e2e/test_prometheus.py has it).
- Every process passes the job's figures to jaxmon.step() (the global batch and its tokens): the job's tokens/s
  summed over its processes' series must be what the loop measures.

The tests of the job run in file order on one job (the stall is last: the others then wait for process 3 forever).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from jaxmon.device_readings import DeviceInfo
from jaxmon.files import write_atomically
from jaxmon.identity import host_name
from jaxmon.sources.spool import safe_name
from jaxmon.sources.spool_codec import spool_device
from jaxmon.sources.spool_document import SCHEMA, SpoolDocument
from tests.conftest import ROOT, Daemon, free_port, parse_samples, wait_until
from tests.deploy_files import JOB_DASHBOARD, JOB_RULES, RULES, alert_rules, dashboard_targets
from tests.fake_kubelet import FakeKubelet, container, pod
from tests.fakenvml import Scenario, device, gpm
from tests.helpers import Child
from tests.prometheus import Prometheus

JOB = ROOT / "tests" / "workloads" / "job.py"
PROCESSES = 4
WORKLOAD = "llama"
DEVICE_WORKLOAD = "skewed"
THROTTLED_GPU = 5
SKEWED_DEVICE = 3
# The skewed workload's GPUs (its JAX devices 0-7, the NVML fake's 0-7): 8 GiB in use on each, twice that on
# SKEWED_DEVICE. GPUs, not CPU devices: the rule leaves CPU devices out (no allocator, and live-array bytes are
# snapshots each process takes at its own point of a step), so the job's CPU devices never page for skew.
GPU_BYTES_IN_USE = 8 << 30
GPU_BYTES_LIMIT = 140 << 30
# nvml.h: nvmlClocksEventReasonHwThermalSlowdown.
HW_THERMAL = 0x40
JOB_ALERTS = (
    "JaxmonTrainingStraggler",
    "JaxmonTrainingComputeStraggler",
    "JaxmonTrainingProcessStalled",
    "JaxmonDeviceMemorySkew",
)
# Sampled traces: a block every 8 steps, at most one each 2 s (the job steps 20-40 times a second here).
PROFILE = {"JAXMON_COLLECTOR__TRAINING__PROFILE__EVERY": "8", "JAXMON_COLLECTOR__TRAINING__PROFILE__MIN_SECONDS": "2"}
# The process whose device is made slow, and about how much longer it computes in each step (ms).
SLOW_PROCESS = 1
SLOW_MS = 300
# The DaemonSet's node: process i runs in pod llama-i of namespace ml, which holds GPU 3 - i (not its index); GPU 4 is
# a pod's that runs no jaxmon, GPU 5 nobody's.
NAMESPACE = "ml"
NODE_GPUS = 6
HOLDER = {3 - i: f"llama-{i}" for i in range(PROCESSES)}
STRAGGLER_POD = "llama-2"
STRAGGLER_GPU = 1
# The GPU (of process 1's pod) whose SMs are then active 40 % of the time where the job's others read 77.5-80.5 %.
IDLE_SM_POD = "llama-1"
IDLE_SM_GPU = 2
KUBELET_TTL = 3.0
# The kubelet outage: its labels are gone for all but the TTL of it. The alerts' `for:` are 4 s here (from 1 to 15
# minutes shipped): an alert whose condition the outage made true would fire many times over within it.
OUTAGE_SECONDS = 20.0
STALL_ALERTS = ("JaxmonTrainingProcessStalled", "JaxmonTrainingStalled")


def clocks(sm_mhz: int) -> dict[str, int]:
    """The fake GPU's current clocks with the SM (and graphics) clock at `sm_mhz`."""
    return {"graphics": sm_mhz, "sm": sm_mhz, "memory": 2619, "video": 1755}


def shortened_rules(tmp: Path) -> Path:
    """job.yml with windows of 15 s (the sampled traces' hour: 20 s, its once-a-minute records every second), `for:`
    of 4 s, a 6 s stall parameter and a compute straggler's gap of 0.3, for a test that lasts a minute."""
    text = JOB_RULES.read_text(encoding="utf-8")
    text = text.replace("[5m]", "[15s]").replace("[1h]", "[20s]").replace("interval: 1m", "interval: 1s")
    text = re.sub(r"\bfor: \d+m\b", "for: 4s", text)
    text, stall = re.subn(r"(record: jaxmon:param:process_stall_seconds\n\s+expr: )vector\(\d+\)", r"\1vector(6)", text)
    text, gap = re.subn(
        r"(record: jaxmon:param:compute_straggler_gap_above\n\s+expr: )vector\([0-9.]+\)", r"\1vector(0.3)", text
    )
    assert stall == 1 and gap == 1 and "[5m]" not in text and "[1h]" not in text and "for: 4s" in text
    path = tmp / "job.yml"
    path.write_text(text, encoding="utf-8")
    return path


def shortened_alerts(tmp: Path) -> Path:
    """alerts.yml with `for:` of 4 s, JaxmonTrainingStalled's 300 s floor at 10 s (the stall parameter is 6 s) and
    JaxmonTrainingCommunicationBound off (its threshold past 1)."""
    text = RULES.read_text(encoding="utf-8")
    text = re.sub(r"\bfor: \d+[mh]\b", "for: 4s", text)
    floor = "jaxmon_training_step_duration_seconds_count, 300)"
    assert text.count(floor) == 1
    text = text.replace(floor, "jaxmon_training_step_duration_seconds_count, 10)")
    bound = text.index("alert: JaxmonTrainingCommunicationBound")
    threshold = text.index(") >= 0.15", bound)
    text = text[:threshold] + ") >= 2" + text[threshold + len(") >= 0.15") :]
    path = tmp / "alerts.yml"
    path.write_text(text, encoding="utf-8")
    return path


@dataclass
class DaemonSetNode:
    """The job's node as a DaemonSet serves it: its node jaxmon, the fake kubelet, the fake NVML's scenario."""

    daemon: Daemon
    kubelet: FakeKubelet
    nvml: Scenario
    lock: threading.Lock  # the scenario is written by the energy meter's thread and by tests

    def update(self, index: int, **fields: Any) -> None:
        with self.lock:
            self.nvml.update(index, **fields)

    def labelled(self) -> bool:
        """Whether the node jaxmon's GPU series carry pods now."""
        samples = parse_samples(self.daemon.get("/metrics").text)
        return any(name == "jaxmon_device_info" and dict(labels).get("pod") for name, labels in samples)


def meter_energy(node: DaemonSetNode, stop: threading.Event) -> None:
    """Advance each fake GPU's energy counter by its power over the time passed, as NVML's does."""
    last = time.monotonic()
    while not stop.wait(0.5):
        now = time.monotonic()
        with node.lock:
            for entry in node.nvml.data["devices"]:
                entry["energy_mj"] += round(entry["power_mw"] * (now - last))
            node.nvml.write()
        last = now


def publish_from_gpus(spool: Path, stop: threading.Event, interval: float = 0.3) -> None:
    """Write the spool document of a publisher of workload DEVICE_WORKLOAD on eight GPUs every `interval`, as
    jaxmon.publish() does (its file name, its codec, an atomic rewrite): each GPU's memory_stats() of the
    cuda_async allocator's shape (tests/fixtures/shapes.json's gpu:2), 8 GiB in use, 16 GiB on SKEWED_DEVICE."""
    host, pid, started = host_name(), os.getpid(), time.time()
    path = spool / f"{safe_name(DEVICE_WORKLOAD)}.{safe_name(host)}.{pid}.json"
    devices = [DeviceInfo(id=i, platform="gpu", device_kind="NVIDIA H200") for i in range(8)]
    while True:
        entries = []
        for dev in devices:
            in_use = GPU_BYTES_IN_USE * (2 if dev.id == SKEWED_DEVICE else 1)
            stats = {
                "num_allocs": 40,
                "bytes_in_use": in_use,
                "peak_bytes_in_use": in_use,
                "largest_alloc_size": 1 << 30,
                "bytes_reserved": 0,
                "peak_bytes_reserved": 0,
                "largest_free_block_bytes": 0,
                "bytes_limit": GPU_BYTES_LIMIT,
            }
            entries.append(spool_device(dev, stats))
        document = SpoolDocument(
            schema=SCHEMA,
            workload=DEVICE_WORKLOAD,
            host=host,
            pid=pid,
            process_index=0,
            jax_version="0.10.2",
            time=time.time(),
            started=started,
            interval=interval,
            devices=entries,
            process_count=1,
        )
        write_atomically(path, document.model_dump(by_alias=True))
        if stop.wait(interval):
            return


@dataclass
class View:
    prometheus: Prometheus
    job: list[Child]  # by process index
    node: DaemonSetNode

    def alerts(self, name: str, state: str = "") -> list[dict[str, str]]:
        """The label sets of `name`'s alerts (pending and firing, or only `state`)."""
        selector = f'alertname="{name}"' + (f', alertstate="{state}"' if state else "")
        return [r["metric"] for r in self.prometheus.query(f"ALERTS{{{selector}}}")]

    def wait_firing(self, name: str, workload: str, timeout: float = 90.0) -> list[dict[str, str]]:
        """`name`'s firing alerts, once one fires for `workload`."""
        expr = f'ALERTS{{alertname="{name}", alertstate="firing", workload="{workload}"}}'
        self.prometheus.wait_for(expr, bool, f"{name} firing for {workload}", timeout)
        return self.alerts(name, "firing")

    def throttle_straggler_gpu(self) -> None:
        """Clock the GPU of process 2's pod down for heat (again, where it is already), and wait until it fires
        as the job's straggler and JaxmonGpuThrottled fires for it."""
        self.node.update(STRAGGLER_GPU, clocks_mhz=clocks(1200), clocks_event_reasons=HW_THERMAL)
        straggler = f'alertname="JaxmonTrainingStraggler", workload="{WORKLOAD}", signal="sm_clock"'
        throttled = f'alertname="JaxmonGpuThrottled", job="jaxmon-daemonset", device="{STRAGGLER_GPU}"'
        for selector, what in ((straggler, "the GPU straggler firing"), (throttled, "its JaxmonGpuThrottled firing")):
            self.prometheus.wait_for(f'ALERTS{{{selector}, alertstate="firing"}}', bool, what, timeout=60)


@pytest.fixture(scope="module")
def view(tmp_path_factory: pytest.TempPathFactory) -> Iterator[View]:
    tmp = tmp_path_factory.mktemp("job-view")
    coordinator = f"127.0.0.1:{free_port()}"
    job: list[Child] = []
    daemons: list[Daemon] = []
    prometheus: Prometheus | None = None
    kubelet: FakeKubelet | None = None
    metering = threading.Event()
    publishing = threading.Event()
    try:
        for index in range(PROCESSES):
            args = ["--coordinator", coordinator, "--processes", str(PROCESSES), "--process-id", str(index)]
            env = {"POD_NAME": f"llama-{index}", "POD_NAMESPACE": NAMESPACE, **PROFILE}
            job.append(Child(tmp, *args, "--workload", WORKLOAD, script=JOB, hello=False, env=env))
        # The DaemonSet's node, while the job starts: six fake GPUs at one clock, each held by the pod the kubelet says.
        gpus = [device(i, clocks_mhz=clocks(1980)) for i in range(NODE_GPUS)]
        holders = [(NAMESPACE, name, "trainer", gpu) for gpu, name in HOLDER.items()] + [
            ("team-b", "notebook-0", "jupyter", 4)
        ]
        kubelet = FakeKubelet(
            [pod(ns, name, container(c, {"nvidia.com/gpu": [gpus[gpu]["uuid"]]})) for ns, name, c, gpu in holders]
        ).start()
        node_nvml = Scenario(tmp / "node-nvml.json", gpus)
        daemonset = Daemon(
            tmp / "daemonset",
            [
                "--node",
                "--collector.nvml",
                "--collector.kubernetes",
                "--collector.kubernetes.socket",
                str(kubelet.socket),
                "--collector.kubernetes.timeout",
                "500ms",
                "--collector.kubernetes.ttl",
                f"{KUBELET_TTL}s",
                "--poll.interval",
                "0.5s",
            ],
            env=node_nvml.env(),
            name="daemonset",
        )
        daemons.append(daemonset)
        pods = DaemonSetNode(daemonset, kubelet, node_nvml, threading.Lock())
        threading.Thread(target=meter_energy, args=(pods, metering), daemon=True).start()
        # Each answers once jax.distributed has all of them.
        assert [c.greet(120)["process_index"] for c in job] == list(range(PROCESSES))

        # The device side: eight fake GPUs, GPU 5 clocked down by a thermal slowdown while the others run at their
        # clock; a publisher of workload "skewed" on them reports to the same jaxmon (so its GPUs serve that
        # workload), its memory skewed onto GPU 3.
        scenario = Scenario(tmp / "nvml.json", [device(i, clocks_mhz=clocks(1980)) for i in range(8)])
        scenario.update(THROTTLED_GPU, clocks_mhz=clocks(1200), clocks_event_reasons=HW_THERMAL)
        spool = tmp / "spool"
        spool.mkdir()
        node = Daemon(
            tmp / "node",
            ["--node", "--collector.nvml", "--collector.spool.dir", str(spool), "--poll.interval", "0.5s"],
            env=scenario.env(),
        )
        daemons.append(node)
        node.wait_ready()
        threading.Thread(target=publish_from_gpus, args=(spool, publishing), daemon=True).start()

        config: dict[str, Any] = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "900ms", "evaluation_interval": "1s"},
            "rule_files": [str(shortened_rules(tmp)), str(shortened_alerts(tmp))],
            "scrape_configs": [
                {
                    "job_name": "jaxmon-job",
                    "static_configs": [{"targets": [c.hello["url"].removeprefix("http://") for c in job[:PROCESSES]]}],
                },
                {"job_name": "jaxmon-node", "static_configs": [{"targets": [f"127.0.0.1:{node.port}"]}]},
                {"job_name": "jaxmon-daemonset", "static_configs": [{"targets": [f"127.0.0.1:{daemonset.port}"]}]},
            ],
        }
        daemonset.wait_ready()
        prometheus = Prometheus(tmp, config)
        prometheus.wait_ready()
        yield View(prometheus, job[:PROCESSES], pods)
    finally:
        metering.set()
        publishing.set()
        if prometheus is not None:
            prometheus.stop()
        for child in job:
            child.close()
        for daemon in daemons:
            daemon.stop()
        if kubelet is not None:
            kubelet.close()


def _indexes(alerts: list[dict[str, str]]) -> set[str]:
    return {a.get("process_index", "") for a in alerts if a.get("workload") == WORKLOAD}


def _by_process(result: list[dict[str, Any]]) -> dict[str, float]:
    return {r["metric"]["process_index"]: float(r["value"][1]) for r in result}


def test_a_steady_job_fires_nothing(view: View) -> None:
    p = view.prometheus
    p.wait_for(
        f'jaxmon:training_host_score{{workload="{WORKLOAD}"}}',
        lambda r: len(r) == PROCESSES,
        "a host score for every process",
        timeout=90,
    )
    # Three samples of every process in the (20 s) hour: the compute-straggler rule compares them.
    p.wait_for(
        f'jaxmon:training_collective_wait_ratio:mean1h{{workload="{WORKLOAD}"}}',
        lambda r: len(r) == PROCESSES,
        "every process's collective wait over three samples",
        timeout=60,
    )
    # Watched for three times the alerts' `for:` (4 s): no job alert is pending or firing for the job.
    deadline = time.monotonic() + 12
    while time.monotonic() < deadline:
        for name in JOB_ALERTS:
            gaps = p.query(f'jaxmon:training_collective_wait_gap:mean1h{{workload="{WORKLOAD}"}}')
            assert _indexes(view.alerts(name)) == set(), (name, view.alerts(name), _by_process(gaps))
        time.sleep(0.5)
    scores = {r["metric"]["process_index"]: float(r["value"][1]) for r in p.query("jaxmon:training_host_score")}
    assert set(scores) == {str(i) for i in range(PROCESSES)} and min(scores.values()) > 0.8, scores


def test_the_jobs_tokens_per_second_is_the_sum_over_its_processes(view: View) -> None:
    """Every process passes the job's global batch and tokens to jaxmon.step() and exports its share: sum() over
    the job's series is the job's tokens/s, as the loop measures it (within 5 %)."""
    # Half a minute of steps in Prometheus first (the loop measures over its last 30 s too): rate() over [30s] of a
    # series younger than the window under-reads (it extrapolates at most a scrape interval past the first sample),
    # and Prometheus's first scrape of the job comes some seconds after the loop's first step. A sample 32 s old
    # says the window is covered.
    started = float(view.job[0].send("status")["started"])
    assert started > 0
    view.prometheus.wait_for(
        f'jaxmon_training_tokens_total{{workload="{WORKLOAD}"}} offset 32s',
        lambda r: len(r) == PROCESSES,
        "half a minute of every process's tokens in Prometheus",
        timeout=150,
    )
    status = view.job[0].send("status")
    measured, at = float(status["tokens_per_second"]), float(status["time"])
    assert measured > 0, status
    (result,) = view.prometheus.api(
        "query", query=f'sum(rate(jaxmon_training_tokens_total{{workload="{WORKLOAD}"}}[30s]))', time=at
    )["result"]
    exported = float(result["value"][1])
    steps = view.prometheus.query(f'rate(jaxmon_training_steps_total{{workload="{WORKLOAD}"}}[30s])')
    problems = view.prometheus.query("jaxmon_training_tracking_problems_total")
    assert exported == pytest.approx(measured, rel=0.05), (exported, measured, status, steps, problems)
    # Each process exports a quarter of it.
    shares = view.prometheus.api(
        "query", query=f'rate(jaxmon_training_tokens_total{{workload="{WORKLOAD}"}}[30s])', time=at
    )["result"]
    assert len(shares) == PROCESSES
    for share in shares:
        assert float(share["value"][1]) == pytest.approx(measured / PROCESSES, rel=0.05), shares


# The Job dashboard's "Where the bytes travel" panels: collective bytes of tracked programs, placed on mesh axes and
# links, which this job has not (its trainer has them in test_prometheus.py).
WHERE_BYTES_TRAVEL = {
    "Bytes per step by axis and link",
    "Achieved against nominal bandwidth",
    "Exposed share by axis and link",
    "Device-to-device copy bytes per step",
    "Copy share by direction",
}


def test_a_host_bound_process_is_the_straggler_and_no_other(view: View) -> None:
    view.job[2].send("delay 150")
    firing = view.wait_firing("JaxmonTrainingStraggler", WORKLOAD)
    assert _indexes(firing) == {"2"}, firing
    (alert,) = [a for a in firing if a.get("workload") == WORKLOAD]
    assert alert["severity"] == "warning" and alert["process_count"] == str(PROCESSES)
    # The job's other processes wait for it in the collective: their host waits stay at the job's median.
    scores = {
        r["metric"]["process_index"]: float(r["value"][1]) for r in view.prometheus.query("jaxmon:training_host_score")
    }
    assert min(scores, key=lambda k: scores[k]) == "2" and scores["2"] < 0.5, scores
    assert all(scores[str(i)] > 0.8 for i in (0, 1, 3)), scores
    # The Job dashboard shows it first, with the variables Grafana would give it.
    values = {"$workload": WORKLOAD, "$k": "3", "$__rate_interval": "10s"}
    for title, ref, expr in dashboard_targets(JOB_DASHBOARD):
        for name, value in values.items():
            expr = expr.replace(name, value)
        result = view.prometheus.query(expr)
        if title == "Lowest host scores":
            assert result and min(result, key=lambda r: float(r["value"][1]))["metric"]["process_index"] == "2"
        elif "ALERTS" not in expr and "device" not in title.lower() and "memory" not in title.lower():
            if title in WHERE_BYTES_TRAVEL:
                continue  # the job tracks no program (no axes nor links): tests/e2e/test_prometheus.py's
            assert result, f"{title} {ref}: {expr} returned nothing"
    # `jaxmon top --once` over the job's endpoints groups them as one job and marks process 2 (its devices have
    # waited for its host since the delay began; the others' hardly ever).
    urls = [c.hello["url"] for c in view.job]
    top = subprocess.run(
        [sys.executable, "-m", "jaxmon", "top", "--once", *urls], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert top.returncode == 0, top.stderr
    assert f"job {WORKLOAD}: {PROCESSES} processes" in top.stdout, top.stdout
    assert "slowest: process 2 on " in top.stdout, top.stdout
    # Its devices come to each collective last and wait least there, as a slow device's would: its own host wait
    # tells the two apart, and the compute-straggler rule stays quiet (watched for twice its `for:`).
    deadline = time.monotonic() + 8
    while time.monotonic() < deadline:
        assert _indexes(view.alerts("JaxmonTrainingComputeStraggler")) == set()
        time.sleep(0.5)
    gaps = _by_process(view.prometheus.query(f'jaxmon:training_collective_wait_gap:mean1h{{workload="{WORKLOAD}"}}'))
    host = _by_process(view.prometheus.query(f'jaxmon:training_host_wait_ratio:rate1h{{workload="{WORKLOAD}"}}'))
    assert max(gaps, key=lambda k: gaps[k]) == "2" and gaps["2"] > 0.1, (gaps, host)
    (median,) = view.prometheus.query(f'jaxmon:training_host_wait_ratio:job_median1h{{workload="{WORKLOAD}"}}')
    assert host["2"] - float(median["value"][1]) >= gaps["2"] / 2, (gaps, host)  # the rule's host clause
    view.job[2].send("delay 0")


def test_the_throttled_gpu_is_named_by_the_rules(view: View) -> None:
    firing = view.wait_firing("JaxmonTrainingStraggler", DEVICE_WORKLOAD)
    devices = [a for a in firing if a.get("workload") == DEVICE_WORKLOAD]
    assert [(a["device"], a["signal"], a["job"]) for a in devices] == [(str(THROTTLED_GPU), "sm_clock", "jaxmon-node")]
    speeds = view.prometheus.query(f'jaxmon:device_speed:relative{{workload="{DEVICE_WORKLOAD}", signal="sm_clock"}}')
    by_device = {r["metric"]["device"]: float(r["value"][1]) for r in speeds}
    assert set(by_device) == {str(i) for i in range(8)}
    assert by_device[str(THROTTLED_GPU)] == pytest.approx(1200 / 1980)
    assert all(by_device[str(i)] == 1.0 for i in range(8) if i != THROTTLED_GPU)


def test_memory_skew_names_the_device(view: View) -> None:
    firing = view.wait_firing("JaxmonDeviceMemorySkew", DEVICE_WORKLOAD)
    skewed = [a for a in firing if a.get("workload") == DEVICE_WORKLOAD]
    assert [(a["device"], a["platform"]) for a in skewed] == [(str(SKEWED_DEVICE), "gpu")], firing
    # Nothing else pages: the job's processes are on CPU devices, which the rule leaves out.
    assert [a for a in firing if a.get("workload") == WORKLOAD] == []
    (relative,) = view.prometheus.query(
        f'jaxmon:workload_device_memory_bytes:relative{{workload="{DEVICE_WORKLOAD}", device="{SKEWED_DEVICE}"}}'
    )
    assert float(relative["value"][1]) == pytest.approx(2.0, rel=0.01)


def _firing() -> str:
    return 'ALERTS{alertstate="firing"}'


def _alert_key(labels: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in labels.items() if k not in ("__name__", "alertstate")))


def test_the_daemonsets_gpus_serve_the_job_through_their_pods(view: View) -> None:
    """The GPUs of a node jaxmon that labels them with their pods (the DaemonSet) join the workload whose processes
    run in those pods: each GPU the workload of the pod the kubelet says holds it, its slow SM clock the job's
    straggler, its energy the job's energy per step."""
    p = view.prometheus
    query = 'jaxmon:gpu_workload:info{job="jaxmon-daemonset"}'
    p.wait_for(query, lambda r: len(r) == PROCESSES, "the job's four GPUs joined to it", timeout=60)
    mapping = p.query(query)
    assert {r["metric"]["device"]: (r["metric"]["pod"], r["metric"]["workload"]) for r in mapping} == {
        str(gpu): (name, WORKLOAD) for gpu, name in HOLDER.items()
    }
    # Energy per step has an answer: at the instant of the rule's last evaluation, the power of the job's four GPUs
    # (the fake's 200-203 W, none of the node's others') over the job's step rate.
    energy = f'jaxmon:workload_energy_joules_per_step:rate5m{{workload="{WORKLOAD}"}}'
    p.wait_for(energy, lambda r: len(r) == 1, "energy per step of the job", timeout=60)
    # Counters older than the rules' 15 s window (rate() reads a younger series low), and a rule evaluated over them.
    p.wait_for(
        'jaxmon_device_energy_joules_total{job="jaxmon-daemonset"} offset 20s',
        lambda r: len(r) == NODE_GPUS,
        "20 s of the GPUs' energy counters",
        timeout=60,
    )
    time.sleep(1)
    (stamp,) = p.query(f"timestamp({energy})")
    at = float(stamp["value"][1])

    def value(expr: str) -> float:
        (result,) = p.api("query", query=expr, time=at)["result"]
        return float(result["value"][1])

    gpus = "|".join(str(gpu) for gpu in HOLDER)
    joules = f'sum(rate(jaxmon_device_energy_joules_total{{job="jaxmon-daemonset", device=~"{gpus}"}}[15s]'
    stepped = f'max(rate(jaxmon_training_steps_total{{workload="{WORKLOAD}"}}[15s]'
    watts = value(joules + "))")
    power = sum(view.node.nvml.data["devices"][gpu]["power_mw"] for gpu in HOLDER) / 1000
    assert watts == pytest.approx(power, rel=0.1)
    # The rule read what was stored when it ran: on a loaded machine a scrape started before then (its samples
    # dated before it) may be stored after it, and a 15 s window of one-second scrapes is a scrape short. The rule is
    # the GPUs' power over the step rate as the windows read with each series' last scrape or two not yet stored.
    late = [(value(f"{joules}{f' offset {k}s' if k else ''}))"), value(f"{stepped}{f' offset {k}s' if k else ''}))"))
            for k in range(3)]  # fmt: skip
    ratios = [w / s for w, _ in late for _, s in late]
    assert min(ratios) * 0.95 <= value(energy) <= max(ratios) * 1.05, (value(energy), late)
    # The GPU of process 2's pod is clocked down for heat: it is the job's straggler, named by its node, GPU and pod,
    # and JaxmonGpuThrottled fires for it (both must stay one alert each through the kubelet outage below).
    view.throttle_straggler_gpu()
    devices = [a for a in view.alerts("JaxmonTrainingStraggler") if a.get("workload") == WORKLOAD and "device" in a]
    assert [(a["job"], a["device"], a["namespace"], a["pod"]) for a in devices] == [
        ("jaxmon-daemonset", str(STRAGGLER_GPU), NAMESPACE, STRAGGLER_POD)
    ], devices
    speeds = p.query(
        f'jaxmon:device_speed:relative{{job="jaxmon-daemonset", workload="{WORKLOAD}", signal="sm_clock"}}'
    )
    by_device = {r["metric"]["device"]: float(r["value"][1]) for r in speeds}
    assert by_device == {str(gpu): 1.0 for gpu in HOLDER if gpu != STRAGGLER_GPU} | {str(STRAGGLER_GPU): 1200 / 1980}


def test_a_kubelet_outage_fires_no_alert(view: View) -> None:
    """The kubelet goes away (its socket with it) and comes back on the same socket: the node jaxmon's pod labels go
    after its TTL and come back. Nothing pages for it: every alert firing before keeps firing (the GPU straggler as
    the same alert), none other fires, and the job keeps its GPUs and its energy per step. Only
    JaxmonCollectorFailing{collector="kubernetes"} fires, here: its condition is the outage itself, and its shipped
    `for:` (10 minutes, 4 s here) is far longer than the outage."""
    p, node = view.prometheus, view.node
    (failing,) = [r for r in alert_rules() if r["alert"] == "JaxmonCollectorFailing"]
    assert failing["for"] == "10m"

    def allowed(labels: dict[str, str]) -> bool:
        return labels["alertname"] == "JaxmonCollectorFailing" and labels.get("collector") == "kubernetes"

    # The straggler GPU and the job's energy per step, as the test before leaves them (and so when run alone).
    view.throttle_straggler_gpu()
    energy = f'jaxmon:workload_energy_joules_per_step:rate5m{{workload="{WORKLOAD}"}}'
    p.wait_for(energy, lambda r: len(r) == 1, "energy per step of the job", timeout=60)
    before = {_alert_key(a["metric"]) for a in p.query(_firing())}
    straggler = [k for k in before if ("signal", "sm_clock") in k and ("workload", WORKLOAD) in k]
    assert len(straggler) == 1, before

    def check() -> None:
        firing = {_alert_key(a["metric"]) for a in p.query(_firing())}
        assert straggler[0] in firing, "the straggler stopped firing"
        new = [dict(k) for k in firing - before if not allowed(dict(k))]
        assert new == [], new
        per_step = p.query(energy)
        assert len(per_step) == 1 and float(per_step[0]["value"][1]) > 0, per_step

    assert node.labelled()
    node.kubelet.stop()
    gone, dropped = time.monotonic(), False
    while time.monotonic() - gone < OUTAGE_SECONDS:
        check()
        dropped = dropped or not node.labelled()
        time.sleep(0.5)
    assert dropped, "the pod labels never dropped"
    # Prometheus evaluated the rules on the unlabelled series: the job kept its GPUs through the mapping.
    unlabelled = p.query('count(jaxmon_device_info{job="jaxmon-daemonset", pod=""})')
    assert unlabelled and float(unlabelled[0]["value"][1]) == NODE_GPUS, unlabelled
    mapped = p.query(f'jaxmon:gpu_workload:info{{job="jaxmon-daemonset", workload="{WORKLOAD}"}}')
    assert {r["metric"]["device"] for r in mapped} == {str(gpu) for gpu in HOLDER}
    node.kubelet.start()
    wait_until(node.labelled, 10, "the pod labels back")
    back = time.monotonic()
    while time.monotonic() - back < 8:  # twice the alerts' `for:` here
        check()
        time.sleep(0.5)
    wait_until(
        lambda: not [a for a in p.query(_firing()) if allowed(a["metric"])], 10, "JaxmonCollectorFailing resolved"
    )
    view.node.update(STRAGGLER_GPU, clocks_mhz=clocks(1980))


def test_a_gpu_with_its_sms_less_active_is_the_straggler_and_no_other(view: View) -> None:
    """Under load the probe says nothing (it measures idle devices only), and a GPU at full clock passes the SM-clock
    signal: GPM's SM activity names the one whose SMs have work less of the time than the job's others."""
    p = view.prometheus
    view.node.update(IDLE_SM_GPU, gpm=gpm(IDLE_SM_GPU, sm_active=40.0))
    selector = f'alertname="JaxmonTrainingStraggler", workload="{WORKLOAD}", signal="sm_active"'
    p.wait_for(f'ALERTS{{{selector}, alertstate="firing"}}', bool, "the SM-activity straggler firing", timeout=60)
    named = [a for a in view.alerts("JaxmonTrainingStraggler") if a.get("signal") == "sm_active"]
    assert [(a["job"], a["device"], a["namespace"], a["pod"]) for a in named] == [
        ("jaxmon-daemonset", str(IDLE_SM_GPU), NAMESPACE, IDLE_SM_POD)
    ], named
    speeds = p.query(f'jaxmon:device_speed:relative{{workload="{WORKLOAD}", signal="sm_active"}}')
    by_device = {r["metric"]["device"]: float(r["value"][1]) for r in speeds}
    # The fake's GPU d reads 80.5 - d %: the job's median of 80.5, 79.5, 40 and 77.5 is 78.5.
    assert by_device == pytest.approx({"0": 80.5 / 78.5, "1": 79.5 / 78.5, "2": 40 / 78.5, "3": 77.5 / 78.5})
    view.node.update(IDLE_SM_GPU, gpm=gpm(IDLE_SM_GPU))


def test_a_device_that_computes_slowly_is_the_compute_straggler_and_no_other(view: View) -> None:
    """Process 1's device computes about 300 ms longer inside each step, before the cross-process reduction: every
    process's step takes its time and every host waits alike, so the host-wait rule sees nothing; the
    sampled traces see the other devices wait for it in the reduction, and JaxmonTrainingComputeStraggler names
    process 1 (its instance and host) and no other."""
    p = view.prometheus
    view.job[SLOW_PROCESS].send(f"slow {SLOW_MS}")
    named: set[str] = set()
    host_rule: list[dict[str, str]] = []

    def watch() -> list[dict[str, str]]:
        alerts = [a for a in view.alerts("JaxmonTrainingComputeStraggler") if a.get("workload") == WORKLOAD]
        named.update(_indexes(alerts))
        host_rule.extend(a for a in view.alerts("JaxmonTrainingStraggler") if _indexes([a]) - {""})
        return [a for a in alerts if a["alertstate"] == "firing"]

    wait_until(lambda: bool(watch()), 90, "JaxmonTrainingComputeStraggler firing", step=0.5)
    deadline = time.monotonic() + 8  # twice its `for:`: no other process is named meanwhile
    while time.monotonic() < deadline:
        (alert,) = watch()
        time.sleep(0.5)
    assert named == {str(SLOW_PROCESS)} and host_rule == [], (named, host_rule)
    slow = view.job[SLOW_PROCESS].hello["url"].removeprefix("http://")
    assert (alert["process_index"], alert["instance"], alert["severity"]) == (str(SLOW_PROCESS), slow, "warning")
    assert alert["host"], alert
    # Its gap is the job's largest by far (the others wait ~the sleep in each step), and its device, in the last
    # sample, waits least of the job's.
    gaps = _by_process(p.query(f'jaxmon:training_collective_wait_gap:mean1h{{workload="{WORKLOAD}"}}'))
    waits = _by_process(p.query(f'jaxmon_training_collective_wait_ratio{{workload="{WORKLOAD}"}}'))
    assert max(gaps, key=lambda k: gaps[k]) == str(SLOW_PROCESS) and gaps[str(SLOW_PROCESS)] > 0.3, gaps
    assert min(waits, key=lambda k: waits[k]) == str(SLOW_PROCESS), waits
    # The host scores stay alike: every host waits for its device, none for its host.
    scores = _by_process(p.query(f'jaxmon:training_host_score{{workload="{WORKLOAD}"}}'))
    assert min(scores.values()) > 0.8, scores
    # The Job dashboard's panel shows it first.
    ((title, _, expr),) = [t for t in dashboard_targets(JOB_DASHBOARD) if "compute stragglers" in t[0]]
    top = p.query(expr.replace("$workload", WORKLOAD).replace("$k", "3"))
    assert max(top, key=lambda r: float(r["value"][1]))["metric"]["process_index"] == str(SLOW_PROCESS), (title, top)
    view.job[SLOW_PROCESS].send("slow 0")


def test_a_stalled_process_is_named_and_not_the_ones_waiting_for_it(view: View) -> None:
    stalled = view.job[3].send("stall")["dispatched"]
    firing = view.wait_firing("JaxmonTrainingProcessStalled", WORKLOAD)
    assert _indexes(firing) == {"3"}, firing
    dispatched = {
        r["metric"]["process_index"]: float(r["value"][1])
        for r in view.prometheus.query(f'jaxmon_training_dispatched_step{{workload="{WORKLOAD}"}}')
    }
    assert dispatched["3"] == stalled and all(dispatched[str(i)] > stalled for i in (0, 1, 2)), dispatched
    # The others have completed nothing either since (they wait in the collective), and stay unnamed.
    wait_until(lambda: _indexes(view.alerts("JaxmonTrainingProcessStalled")) == {"3"}, 5, "only process 3")
    # One stall, one page: past JaxmonTrainingStalled's floor (10 s here) and its `for:` (4 s), with every process
    # stalled by its measure, the only critical stall alert, pending or firing, is process 3's.
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        critical = [
            a
            for name in STALL_ALERTS
            for a in view.alerts(name)
            if a.get("workload") == WORKLOAD and a.get("severity") == "critical"
        ]
        assert [(a["alertname"], a.get("process_index")) for a in critical] == [
            ("JaxmonTrainingProcessStalled", "3")
        ], critical
        time.sleep(0.5)
    # JaxmonTrainingStalled's own condition does hold for the workload's processes: only the culprit silences it.
    ages = view.prometheus.query(f'time() - jaxmon_training_last_step_timestamp_seconds{{workload="{WORKLOAD}"}} > 10')
    assert len(ages) == PROCESSES, ages
