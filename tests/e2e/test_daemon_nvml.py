"""The real daemon with the fake libnvidia-ml.so.1 on its LD_LIBRARY_PATH (tests/fakenvml), scraped over HTTP on
loopback: every NVML series against the scenario the test writes and changes, Xid delivery, a lost GPU, a hung
NVML call, a wedged GPU among eight (with a real Prometheus evaluating the shipped alerts), a replayed JAX GPU device
on a GPU NVML loses (the alerts' join of the two, in a real Prometheus), an old driver's library, no library at all,
and the join of NVML's processes with spool reports."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.conftest import ROOT, Daemon, Samples, StartDaemon, parse_samples, sample
from tests.fakenvml import GPU_IS_LOST, H200_MAX_CLOCKS_MHZ, Scenario, device, link, mig_device
from tests.helpers import Child, wait_until
from tests.prometheus import Prometheus

GIB = 1 << 30
FAST = ("--no-collector.probe", "--poll.interval", "0.3s")


def gpu(index: int, **extra: str) -> dict[str, str]:
    return {"device": str(index), "platform": "gpu", "source": "nvml", **extra}


def nvml_success(s: Samples) -> float | None:
    return sample(s, "jaxmon_collector_success", collector="nvml")


def start(start_daemon: StartDaemon, scenario: Scenario, *args: str, legacy: bool = False) -> Daemon:
    return start_daemon(*FAST, "--collector.nvml", *args, env=scenario.env(legacy))


def test_the_daemon_exports_every_nvml_series_with_the_scenarios_values(
    start_daemon: StartDaemon, tmp_path: Path
) -> None:
    gpus = [device(i) for i in range(8)]
    gpus[2].update(
        memory={"total": 24 * GIB, "reserved": GIB, "used": 20 * GIB},
        utilization={"gpu": 88, "memory": 33},
        power_mw=301_500,
        power_limit_mw=350_000,
        temperature_c=79,
        clocks_mhz={"graphics": 1770, "sm": 1755, "memory": 2619, "video": 1500},
        clocks_event_reasons=0x20 | 0x80,  # SW thermal slowdown + HW power brake
        ecc={"enabled": True, "corrected": 5, "uncorrected": 1},
        processes=[{"pid": 31337, "used": 19 * GIB}],
        fans=[55],
        encoder_util=3,
        decoder_util=44,
        power_management_limit_mw=600_000,
        energy_mj=7_654_321,
        pcie={"tx_kbps": 31_000, "rx_kbps": 17_000, "replays": 12},
        remapped_rows={"correctable": 4, "uncorrectable": 2, "pending": False, "failure": True},
        nvlink=[link(2, n, active=n != 5, crc_flit=n, replay=2 * n, tx_kib=10 * n, rx_kib=20 * n) for n in range(18)],
    )
    mig = [mig_device(5, 0, "1g.18gb", 13), mig_device(5, 1, "2g.35gb", 5, utilization={"gpu": 22, "memory": 7})]
    gpus[5].update(mig={"current": 1, "pending": 1, "max_devices": 7, "devices": mig}, not_supported=["utilization"])
    d = start(start_daemon, Scenario(tmp_path / "scenario.json", gpus))
    s = d.wait_for(lambda s: nvml_success(s) == 1, what="an nvml poll")
    g = gpu(2)
    assert sample(s, "jaxmon_device_source_up", **g) == 1
    assert sample(s, "jaxmon_device_memory_total_bytes", **g) == 24 * GIB
    assert sample(s, "jaxmon_device_memory_used_bytes", **g) == 20 * GIB
    assert sample(s, "jaxmon_device_duty_cycle_ratio", **g) == 0.88
    assert sample(s, "jaxmon_device_memory_bandwidth_utilization_ratio", **g) == 0.33
    assert sample(s, "jaxmon_device_power_watts", **g) == 301.5
    assert sample(s, "jaxmon_device_power_limit_watts", **g) == 350.0
    assert sample(s, "jaxmon_device_temperature_celsius", **g) == 79
    assert sample(s, "jaxmon_device_graphics_clock_hertz", **g) == 1770e6
    assert sample(s, "jaxmon_device_sm_clock_hertz", **g) == 1755e6
    assert sample(s, "jaxmon_device_memory_clock_hertz", **g) == 2619e6
    assert sample(s, "jaxmon_device_video_clock_hertz", **g) == 1500e6
    for clock, mhz in H200_MAX_CLOCKS_MHZ.items():
        assert sample(s, f"jaxmon_device_{clock}_clock_max_hertz", **g) == mhz * 1e6
    assert sample(s, "jaxmon_device_fan_speed_ratio", **g, fan="0") == 0.55
    assert sample(s, "jaxmon_device_encoder_utilization_ratio", **g) == 0.03
    assert sample(s, "jaxmon_device_decoder_utilization_ratio", **g) == 0.44
    assert sample(s, "jaxmon_device_power_management_limit_watts", **g) == 600.0
    assert sample(s, "jaxmon_device_energy_joules_total", **g) == 7_654.321
    assert sample(s, "jaxmon_device_pcie_throughput_bytes_per_second", **g, direction="tx") == 31_000 * 1024
    assert sample(s, "jaxmon_device_pcie_throughput_bytes_per_second", **g, direction="rx") == 17_000 * 1024
    assert sample(s, "jaxmon_device_pcie_replays_total", **g) == 12
    assert sample(s, "jaxmon_device_remapped_rows_total", **g, kind="correctable") == 4
    assert sample(s, "jaxmon_device_remapped_rows_total", **g, kind="uncorrectable") == 2
    assert sample(s, "jaxmon_device_row_remapping_pending", **g) == 0
    assert sample(s, "jaxmon_device_row_remapping_failed", **g) == 1
    for n in range(18):
        assert sample(s, "jaxmon_device_nvlink_active", **g, link=str(n)) == (0 if n == 5 else 1)
    # Traffic and errors per GPU by default: summed over the 17 active links (link 5 is down).
    active = sum(n for n in range(18) if n != 5)
    assert sample(s, "jaxmon_device_nvlink_data_bytes_total", **g, direction="tx") == 10 * active * 1024
    assert sample(s, "jaxmon_device_nvlink_data_bytes_total", **g, direction="rx") == 20 * active * 1024
    assert sample(s, "jaxmon_device_nvlink_errors_total", **g, kind="crc_flit") == active
    assert sample(s, "jaxmon_device_nvlink_errors_total", **g, kind="replay") == 2 * active
    assert sample(s, "jaxmon_device_nvlink_errors_total", **g, kind="recovery") == 0
    assert not [k for k in s if ("link", "0") in k[1] and k[0] != "jaxmon_device_nvlink_active"]
    # GPU 5 runs in MIG mode: its two MIG devices, by UUID, instance and profile.
    assert sample(s, "jaxmon_device_mig_enabled", **gpu(5)) == 1
    assert sample(s, "jaxmon_device_duty_cycle_ratio", **gpu(5)) is None
    for entry, profile in zip(mig, ("1g.18gb", "2g.35gb"), strict=True):
        own = gpu(
            5, mig_uuid=entry["uuid"], gpu_instance=str(entry["gpu_instance"]), compute_instance="0", profile=profile
        )
        assert sample(s, "jaxmon_mig_device_memory_total_bytes", **own) == entry["memory"]["total"]
        assert sample(s, "jaxmon_mig_device_memory_used_bytes", **own) == entry["memory"]["used"]
        assert sample(s, "jaxmon_mig_device_duty_cycle_ratio", **own) == (0.22 if profile == "2g.35gb" else None)
        assert s.get(("jaxmon_mig_device_info", frozenset({**own, "name": entry["name"]}.items()))) == 1
    assert len([k for k in s if k[0] == "jaxmon_mig_device_info"]) == 2
    throttled = {k: v for k, v in s.items() if k[0] == "jaxmon_device_throttled" and ("device", "2") in k[1]}
    assert len(throttled) == 9
    assert {dict(k[1])["reason"] for k, v in throttled.items() if v == 1} == {
        "sw_thermal_slowdown",
        "hw_power_brake_slowdown",
    }
    assert sample(s, "jaxmon_device_ecc_errors_total", **g, kind="corrected") == 5
    assert sample(s, "jaxmon_device_ecc_errors_total", **g, kind="uncorrected") == 1
    assert sample(s, "jaxmon_process_device_memory_bytes", **g, pid="31337") == 19 * GIB
    assert sample(s, "jaxmon_process_device_memory_other_bytes", **g) == 0
    info = gpu(2, uuid=gpus[2]["uuid"], pci_bus_id="00000000:1A:00.0", name=gpus[2]["name"], device_match="nvml_index")
    assert s.get(("jaxmon_device_info", frozenset(info.items()))) == 1
    # The seven others report their own, distinct values.
    assert sorted(int(dict(k[1])["device"]) for k in s if k[0] == "jaxmon_device_source_up") == list(range(8))
    for i in (0, 1, 3, 4, 5, 6, 7):
        assert sample(s, "jaxmon_device_memory_used_bytes", **gpu(i)) == (10 + i) * GIB
        assert sample(s, "jaxmon_device_temperature_celsius", **gpu(i)) == 40 + i
        assert sample(s, "jaxmon_device_power_watts", **gpu(i)) == 200 + i
        assert sample(s, "jaxmon_device_sm_clock_hertz", **gpu(i)) == (1980 - i) * 1e6
        assert sample(s, "jaxmon_device_energy_joules_total", **gpu(i)) == 3_600_000 + 1000 * i
        assert sample(s, "jaxmon_device_decoder_utilization_ratio", **gpu(i)) == i / 100
        assert sample(s, "jaxmon_device_fan_speed_ratio", **gpu(i), fan="0") is None  # SXM boards: no fans
        assert len([k for k in s if k[0] == "jaxmon_device_nvlink_active" and ("device", str(i)) in k[1]]) == 18
        if i != 5:
            assert sample(s, "jaxmon_device_mig_enabled", **gpu(i)) == 0
    # The daemon's own JAX devices (CPU) are still there beside the GPUs.
    assert any(k[0] == "jaxmon_device_info" and ("platform", "cpu") in k[1] for k in s)

    # /metrics?collect[]=nvml selects the nvml collector's families only.
    selected = d.get("/metrics", params={"collect[]": "nvml"}).text
    assert "jaxmon_device_temperature_celsius" in selected
    assert "jaxmon_memory_stats_supported" not in selected
    assert "jaxmon_device_temperature_celsius" not in d.get("/metrics", params={"collect[]": "memory"}).text


def test_changed_values_xid_events_and_a_lost_gpu_reach_the_scrape(start_daemon: StartDaemon, tmp_path: Path) -> None:
    scenario = Scenario(tmp_path / "scenario.json", [device(0), device(1)])
    d = start(start_daemon, scenario)
    d.wait_for(lambda s: nvml_success(s) == 1, what="an nvml poll")

    scenario.update(0, utilization={"gpu": 64, "memory": 2}, power_mw=123_000)
    s = d.wait_for(lambda s: sample(s, "jaxmon_device_duty_cycle_ratio", **gpu(0)) == 0.64, what="new duty cycle")
    assert sample(s, "jaxmon_device_power_watts", **gpu(0)) == 123.0

    # Counters that rise (NVLink errors, PCIe replays, energy), summed over the GPU's links.
    links = [link(1, n) for n in range(18)]
    links[3] = link(1, 3, replay=4, recovery=1)
    links[7] = link(1, 7, replay=2)
    scenario.update(1, nvlink=links, pcie={"tx_kbps": 1, "rx_kbps": 2, "replays": 9}, energy_mj=4_000_000_000)
    s = d.wait_for(
        lambda s: sample(s, "jaxmon_device_nvlink_errors_total", **gpu(1, kind="replay")) == 6,
        what="NVLink replays counted",
    )
    assert sample(s, "jaxmon_device_nvlink_errors_total", **gpu(1, kind="recovery")) == 1
    tx = sample(s, "jaxmon_device_nvlink_data_bytes_total", **gpu(1, direction="tx"))
    assert tx == sum(link(1, n)["tx_kib"] for n in range(18)) * 1024
    assert sample(s, "jaxmon_device_pcie_replays_total", **gpu(1)) == 9
    assert sample(s, "jaxmon_device_energy_joules_total", **gpu(1)) == 4_000_000.0
    # A link goes down: its state says so, and its counts stay in the sums (a sum that fell would read as a reset).
    links[7] = link(1, 7, active=False)
    scenario.update(1, nvlink=links)
    s = d.wait_for(lambda s: sample(s, "jaxmon_device_nvlink_active", **gpu(1, link="7")) == 0, what="link 7 down")
    assert sample(s, "jaxmon_device_nvlink_errors_total", **gpu(1, kind="replay")) == 6
    assert sample(s, "jaxmon_device_nvlink_data_bytes_total", **gpu(1, direction="tx")) == tx

    scenario.xid(1, 79)
    scenario.xid(0, 48)
    scenario.xid(1, 79)
    s = d.wait_for(
        lambda s: (
            sample(s, "jaxmon_device_xid_errors_total", **gpu(1, xid="79")) == 2
            and sample(s, "jaxmon_device_xid_errors_total", **gpu(0, xid="48")) == 1
        ),
        what="three Xid events counted",
    )
    assert {k for k in s if k[0] == "jaxmon_device_xid_errors_total"} == {
        ("jaxmon_device_xid_errors_total", frozenset(gpu(1, xid="79").items())),
        ("jaxmon_device_xid_errors_total", frozenset(gpu(0, xid="48").items())),
    }

    scenario.update(1, error=GPU_IS_LOST)
    s = d.wait_for(lambda s: sample(s, "jaxmon_device_source_up", **gpu(1)) == 0, what="GPU 1 down")
    assert nvml_success(s) == 1, "NVML answers: one lost GPU is its own source_up 0, not a failing collector"
    assert sample(s, "jaxmon_device_source_up", **gpu(0)) == 1
    assert sample(s, "jaxmon_device_memory_used_bytes", **gpu(1)) is None
    # The other GPU keeps flowing: a change on GPU 0 still arrives while GPU 1 is lost.
    scenario.update(0, temperature_c=66)
    d.wait_for(lambda s: sample(s, "jaxmon_device_temperature_celsius", **gpu(0)) == 66, what="GPU 0 still read")
    # Xid counts survive the loss of their GPU.
    assert sample(d.scrape(), "jaxmon_device_xid_errors_total", **gpu(1, xid="79")) == 2
    assert "GPU_IS_LOST" in d.log()

    scenario.update(1, error=None)
    s = d.wait_for(lambda s: sample(s, "jaxmon_device_source_up", **gpu(1)) == 1, what="GPU 1 back")
    assert nvml_success(s) == 1


def test_a_hung_nvml_call_never_blocks_a_scrape(start_daemon: StartDaemon, tmp_path: Path) -> None:
    scenario = Scenario(tmp_path / "scenario.json", [device(0), device(1)])
    # A deadline longer than the hung call: the poll waits for it, and scrapes meanwhile serve the last snapshot.
    d = start(start_daemon, scenario, "--collector.nvml.timeout", "10s")
    d.wait_for(lambda s: nvml_success(s) == 1, what="an nvml poll")
    # GPU 1's calls hang (for 8 s at most, within the poll's deadline: the poll waits for the call, it never fails).
    scenario.update(1, hang_until=time.time() + 8, temperature_c=99)
    # The fake counts the calls blocked in a hang: a poll is inside GPU 1's call once it says so.
    wait_until(lambda: scenario.blocked_calls() == 1, timeout=5, what="a poll inside GPU 1's hung call")
    for _ in range(5):
        # A scrape answers from the last snapshot, within a timeout far shorter than the hung call.
        r = d.get("/metrics", timeout=1.5)
        assert r.status_code == 200
        assert sample(parse_samples(r.text), "jaxmon_device_temperature_celsius", **gpu(1)) == 41
        time.sleep(0.2)
    assert scenario.blocked_calls() == 1, "the scrapes above were served while the poll was inside the hung call"
    scenario.update(1, hang_until=None)
    d.wait_for(lambda s: sample(s, "jaxmon_device_temperature_celsius", **gpu(1)) == 99, what="the poll to finish")
    assert scenario.blocked_calls() == 0


def test_an_old_driver_library_is_read_through_its_older_calls(start_daemon: StartDaemon, tmp_path: Path) -> None:
    mig = {"current": 1, "devices": [mig_device(0, 0, "1g.18gb", 9)]}
    dev = device(0, clocks_event_reasons=0x8, processes=[{"pid": 5, "used": GIB}], fans=[47, 48], mig=mig)
    scenario = Scenario(tmp_path / "scenario.json", [dev])
    d = start(start_daemon, scenario, legacy=True)
    s = d.wait_for(lambda s: nvml_success(s) == 1, what="an nvml poll")
    # No per-fan calls: the one-fan call stands in. No row remapper and no MIG in this library: absent series.
    assert sample(s, "jaxmon_device_fan_speed_ratio", **gpu(0, fan="0")) == 0.47
    assert sample(s, "jaxmon_device_fan_speed_ratio", **gpu(0, fan="1")) is None
    assert not [k for k in s if "remap" in k[0] or "mig" in k[0]]
    assert sample(s, "jaxmon_device_nvlink_active", **gpu(0, link="17")) == 1
    # v1 memory info counts the driver's reservation as used.
    assert sample(s, "jaxmon_device_memory_used_bytes", **gpu(0)) == 10 * GIB + (512 << 20)
    assert sample(s, "jaxmon_device_throttled", **gpu(0, reason="hw_slowdown")) == 1
    assert sample(s, "jaxmon_process_device_memory_bytes", **gpu(0, pid="5")) == GIB


def test_without_the_library_auto_is_silently_off_and_an_explicit_flag_reports_failure(
    start_daemon: StartDaemon,
) -> None:
    auto = start_daemon(*FAST)
    s = auto.wait_for(lambda s: sample(s, "jaxmon_collector_success", collector="memory") is not None, what="a poll")
    assert nvml_success(s) is None
    assert not [k for k in s if ("source", "nvml") in k[1]]
    assert "libnvidia-ml.so.1" not in auto.log()

    explicit = start_daemon(*FAST, "--collector.nvml")
    explicit.wait_for(lambda s: nvml_success(s) == 0, what="nvml reported failing")
    errors = [json.loads(line) for line in explicit.log().splitlines() if '"collector cannot run"' in line]
    assert [(e["level"], e["collector"]) for e in errors] == [("error", "nvml")], "logged once, as an error"
    assert errors[0]["reason"] == "libnvidia-ml.so.1 does not load (no NVIDIA driver library on the library path)"


def test_nvml_processes_carry_the_workload_of_the_spool_report_with_their_pid(
    start_daemon: StartDaemon, tmp_path: Path
) -> None:
    spool = tmp_path / "spool"
    trainer = Child(tmp_path, "publish", "--spool", str(spool), "--workload", "trainer", "--interval", "0.3")
    try:
        trainer.send("train 1")
        scenario = Scenario(
            tmp_path / "scenario.json",
            [device(0, processes=[{"pid": trainer.proc.pid, "used": 7 * GIB}, {"pid": 1, "used": GIB}])],
        )
        d = start(start_daemon, scenario, "--collector.spool.dir", str(spool))
        # This test shares one PID namespace with the trainer, as `--pid=container:trainer` gives a sidecar.
        s = d.wait_for(
            lambda s: (
                sample(s, "jaxmon_process_device_memory_bytes", **gpu(0, pid=str(trainer.proc.pid))) is None
                and sample(
                    s, "jaxmon_process_device_memory_bytes", **gpu(0, pid=str(trainer.proc.pid), workload="trainer")
                )
                == 7 * GIB
            ),
            what="the trainer's process joined with its report",
        )
        assert sample(s, "jaxmon_process_device_memory_bytes", **gpu(0, pid="1")) == GIB
    finally:
        trainer.close()


def test_jaxmon_snapshot_prints_what_nvml_reads(tmp_path: Path) -> None:
    scenario = Scenario(tmp_path / "scenario.json", [device(0), device(1, error=GPU_IS_LOST)])
    command = [sys.executable, "-m", "jaxmon", "snapshot", "--no-collector.probe", "--collector.nvml"]
    env = {**os.environ, "JAX_NUM_CPU_DEVICES": "8", **scenario.env()}
    result = subprocess.run([*command, "--json"], capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert result.returncode == 0, result.stderr
    nvml = json.loads(result.stdout)["nvml"]
    assert nvml["error"] is None
    first, lost = nvml["gpus"]
    assert (first["index"], first["memory_used_bytes"], first["power_watts"], first["error"]) == (
        0,
        10 * GIB,
        200.0,
        None,
    )
    assert lost["index"] == 1 and lost["error"].startswith("NVML_ERROR_GPU_IS_LOST")
    table = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert table.returncode == 0, table.stderr
    rows = {line.split()[0]: line for line in table.stdout.splitlines()[1:] if line[:1].isdigit()}
    assert rows["0"].split()[-5:] == ["0.100", "200.0", "700.0", "40", "yes"]
    assert "NO: NVML_ERROR_GPU_IS_LOST" in rows["1"]


ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
# The wedge lasts 60 s; 15 s with a 1 s poll and a 0.8 s deadline is the same behaviour (15 polls find the
# GPU hung, its one read outlasting 18 deadlines) in a quarter of the time. (A 0.3 s deadline was seen missed by
# healthy GPUs on a loaded 2-core machine: the deadline is the daemon's, well under its poll interval.)
HANG_SECONDS = 15
WEDGED = 3
OTHERS = [i for i in range(8) if i != WEDGED]


def _energy(index: int, round_no: int) -> float:
    """GPU `index`'s energy counter in joules after round `round_no` of the test (the fake reports millijoules)."""
    return 3_600_000 + 1000 * index + round_no


def _firing(prometheus: Prometheus) -> set[tuple[str, str]]:
    return {
        (r["metric"]["alertname"], r["metric"].get("device", ""))
        for r in prometheus.query('ALERTS{alertstate="firing"}')
    }


def test_a_gpus_first_read_may_take_longer_than_the_deadline(start_daemon: StartDaemon, tmp_path: Path) -> None:
    """Opening a GPU (persistence mode off: the driver wakes it) takes seconds: the first read has its own budget,
    so a slow start-up is not logged as unresponsive GPUs. Later reads keep the deadline."""
    scenario = Scenario(tmp_path / "scenario.json", [device(i) for i in range(4)])
    scenario.hang(2, 4)  # every call on GPU 2 waits until 4 s from now: its first read outlasts the deadline
    args = ("--node", "--collector.nvml", "--poll.interval", "1s", "--collector.nvml.timeout", "0.5s")
    d = start_daemon(*args, env=scenario.env())
    d.wait_for(lambda s: all(sample(s, "jaxmon_device_source_up", **gpu(i)) == 1 for i in range(4)), what="4 GPUs up")
    assert "NVML GPU read failed" not in d.log()
    scenario.hang(2, 3)  # now past its first read: the deadline holds
    d.wait_for(lambda s: sample(s, "jaxmon_device_source_up", **gpu(2)) == 0, what="GPU 2 down")


def test_a_wedged_gpu_is_one_dark_gpu_the_others_stay_fresh_and_it_comes_back_by_itself(
    start_daemon: StartDaemon, tmp_path: Path
) -> None:
    scenario = Scenario(tmp_path / "scenario.json", [device(i) for i in range(8)])
    args = ("--node", "--collector.nvml", "--poll.interval", "1s", "--collector.nvml.timeout", "0.8s")
    d = start_daemon(*args, env=scenario.env())
    d.wait_for(lambda s: all(sample(s, "jaxmon_device_source_up", **gpu(i)) == 1 for i in range(8)), what="8 GPUs up")
    pid = d.proc.pid
    # The shipped alerts, their `for:` shortened to 4 s, evaluated by a real Prometheus scraping the daemon.
    rules = tmp_path / "alerts.yml"
    rules.write_text(re.sub(r"\bfor: \d+[mh]\b", "for: 4s", ALERTS.read_text(encoding="utf-8")), encoding="utf-8")
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "900ms", "evaluation_interval": "1s"},
        "rule_files": [str(rules)],
        "scrape_configs": [{"job_name": "jaxmon-node", "static_configs": [{"targets": [f"127.0.0.1:{d.port}"]}]}],
    }
    prometheus = Prometheus(tmp_path, config)
    try:
        prometheus.wait_ready()
        prometheus.wait_for('up{job="jaxmon-node"}', lambda r: bool(r) and r[0]["value"][1] == "1", "scraped")
        violations: list[str] = []

        def checked(s: Samples) -> Samples:
            """Every scrape: the seven others up with their readings; the wedged GPU, while down, has no value."""
            for i in OTHERS:
                if (
                    sample(s, "jaxmon_device_source_up", **gpu(i)) != 1
                    or sample(s, "jaxmon_device_energy_joules_total", **gpu(i)) is None
                ):
                    violations.append(f"GPU {i} not up with its readings")
            if sample(s, "jaxmon_device_source_up", **gpu(WEDGED)) == 0:
                stale = {k[0] for k in s if ("device", str(WEDGED)) in k[1]}
                stale -= {"jaxmon_device_source_up", "jaxmon_device_info"}
                if stale:
                    violations.append(f"the wedged GPU has values: {sorted(stale)}")
            return s

        scenario.hang(WEDGED, HANG_SECONDS)
        d.wait_for(lambda s: sample(checked(s), "jaxmon_device_source_up", **gpu(WEDGED)) == 0, what="GPU 3 down")
        fired: set[tuple[str, str]] = set()
        rounds_while_wedged = 0
        for round_no in range(1, 200):
            # A new energy reading on every GPU: the seven others must show it while GPU 3 hangs.
            for i in range(8):
                scenario.data["devices"][i]["energy_mj"] = 1000 * _energy(i, round_no)
            scenario.write()

            def fresh(s: Samples, r: int = round_no) -> bool:
                energy = [sample(checked(s), "jaxmon_device_energy_joules_total", **gpu(i)) for i in OTHERS]
                return energy == [_energy(i, r) for i in OTHERS]

            s = d.wait_for(fresh, what=f"round {round_no}: the seven others' new readings")
            # The daemon is never restarted and stays healthy: it is working.
            assert d.alive() and d.proc.pid == pid
            assert d.status("/healthz") == 200
            if sample(s, "jaxmon_device_source_up", **gpu(WEDGED)) == 1:
                # Back by itself (the test never touched the hang): with this round's reading, not an old one.
                assert sample(s, "jaxmon_device_energy_joules_total", **gpu(WEDGED)) == _energy(WEDGED, round_no)
                break
            rounds_while_wedged += 1
            fired |= _firing(prometheus)
        else:
            raise AssertionError("GPU 3 never came back")
        assert violations == []
        assert rounds_while_wedged >= 3, "the seven others' readings kept arriving while GPU 3 hung"
        assert fired == {("JaxmonGpuLost", str(WEDGED))}, "JaxmonGpuLost fired for the wedged GPU alone"
        prometheus.wait_for('ALERTS{alertname="JaxmonGpuLost"}', lambda r: not r, "JaxmonGpuLost resolved")
        events = [json.loads(line) for line in d.log().splitlines() if line.startswith("{")]
        failed = [e for e in events if e.get("event") == "NVML GPU read failed"]
        assert [(e["gpu"], e["error"]) for e in failed] == [
            (WEDGED, "NVML did not answer within 0.8s (a call on this GPU hangs; its next read starts once it returns)")
        ], "its reason logged once"
        assert [e["gpu"] for e in events if e.get("event") == "NVML GPU read works again"] == [WEDGED]
    finally:
        prometheus.stop()


def test_a_jax_device_on_a_lost_gpu_is_the_gpus_alert_alone(start_daemon: StartDaemon, tmp_path: Path) -> None:
    """One daemon reads one GPU both as a JAX device and through NVML: a replayed gpu:0 (no GPU here; replay is the
    JAX device source that can be a GPU) whose memory_stats() raises, and the fake NVML's one GPU, which the nvml
    collector matches to it (device_match="only_gpu", with the GPU's uuid). A real Prometheus evaluates the shipped
    alerts, their `for:` shortened to 2 s. While NVML reads the GPU fine, the failing JAX device is its own alert
    (JaxmonDeviceMemoryUnreadable); once NVML reads the GPU as lost, that fault is JaxmonGpuLost alone."""
    replay = tmp_path / "replay.json"
    lost_device = {"id": 0, "platform": "gpu", "device_kind": "NVIDIA H200", "error": "INTERNAL: device lost"}
    replay.write_text(json.dumps({"devices": [lost_device]}), encoding="utf-8")
    scenario = Scenario(tmp_path / "scenario.json", [device(0)])
    d = start_daemon("--replay", str(replay), "--collector.nvml", "--poll.interval", "1s", env=scenario.env())
    s = d.wait_for(lambda s: sample(s, "jaxmon_device_source_up", **gpu(0)) == 1, what="the GPU read")
    # The nvml collector's row of the GPU, whose device label is the JAX device's id: what the rules join by.
    row = gpu(0, uuid=device(0)["uuid"], pci_bus_id="00000000:18:00.0", name="NVIDIA H200", device_match="only_gpu")
    assert s.get(("jaxmon_device_info", frozenset(row.items()))) == 1, s
    assert sample(s, "jaxmon_memory_read_success", device="0", platform="gpu") == 0
    rules = tmp_path / "alerts.yml"
    rules.write_text(re.sub(r"\bfor: \d+[mh]\b", "for: 2s", ALERTS.read_text(encoding="utf-8")), encoding="utf-8")
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "900ms", "evaluation_interval": "1s"},
        "rule_files": [str(rules)],
        "scrape_configs": [{"job_name": "jaxmon", "static_configs": [{"targets": [f"127.0.0.1:{d.port}"]}]}],
    }
    prometheus = Prometheus(tmp_path, config)
    device_alerts = 'ALERTS{alertname=~"JaxmonDeviceMemoryUnreadable|JaxmonGpuLost", alertstate="firing"}'

    def named(result: list[dict[str, Any]]) -> set[tuple[str, str]]:
        return {(r["metric"]["alertname"], r["metric"]["device"]) for r in result}

    try:
        prometheus.wait_ready()
        # The GPU is well: the JAX device's failure is its own alert.
        prometheus.wait_for(
            device_alerts, lambda r: named(r) == {("JaxmonDeviceMemoryUnreadable", "0")}, "the JAX device's alert"
        )
        scenario.update(0, error=GPU_IS_LOST)
        d.wait_for(lambda s: sample(s, "jaxmon_device_source_up", **gpu(0)) == 0, what="the GPU lost")
        # The GPU is lost: its alert alone; the JAX device's is not even pending.
        prometheus.wait_for(device_alerts, lambda r: named(r) == {("JaxmonGpuLost", "0")}, "the GPU's alert alone")
        assert prometheus.query('ALERTS{alertname="JaxmonDeviceMemoryUnreadable"}') == []
        # NVML kept the identity it read before: the row that joins the JAX device to the GPU is still there.
        assert d.scrape().get(("jaxmon_device_info", frozenset(row.items()))) == 1
    finally:
        prometheus.stop()


def test_per_link_nvlink_series_and_the_process_bound_are_options(start_daemon: StartDaemon, tmp_path: Path) -> None:
    links = [link(0, n, active=n != 2, replay=n) for n in range(18)]
    processes = [{"pid": 100 + n, "used": (n + 1) * GIB} for n in range(50)]
    scenario = Scenario(tmp_path / "scenario.json", [device(0, nvlink=links, processes=processes)])
    d = start(start_daemon, scenario, "--collector.nvml.nvlink-links", "--collector.nvml.max-processes", "4")
    s = d.wait_for(lambda s: nvml_success(s) == 1, what="an nvml poll")
    g = gpu(0)
    for n in range(18):
        up = n != 2
        assert sample(s, "jaxmon_device_nvlink_active", **g, link=str(n)) == (1 if up else 0)
        replay = sample(s, "jaxmon_device_nvlink_errors_total", **g, link=str(n), kind="replay")
        tx = sample(s, "jaxmon_device_nvlink_data_bytes_total", **g, link=str(n), direction="tx")
        assert (replay, tx) == ((n, links[n]["tx_kib"] * 1024) if up else (None, None))
    # Per link instead of per GPU, never both.
    assert sample(s, "jaxmon_device_nvlink_errors_total", **g, kind="replay") is None
    # The 4 largest of 50 processes by pid; the 46 others counted together.
    pids = {dict(k[1])["pid"]: v for k, v in s.items() if k[0] == "jaxmon_process_device_memory_bytes"}
    assert pids == {str(100 + n): (n + 1) * GIB for n in range(46, 50)}
    assert sample(s, "jaxmon_process_device_memory_other_bytes", **g) == sum(n + 1 for n in range(46)) * GIB
    assert sample(s, "jaxmon_process_device_memory_other_processes", **g) == 46
    # Processes come and go: the bound holds, the series set stays the same size.
    scenario.update(0, processes=[{"pid": 900 + n, "used": n * GIB} for n in range(1, 31)])
    s = d.wait_for(
        lambda s: sample(s, "jaxmon_process_device_memory_other_processes", **g) == 26, what="the new processes"
    )
    assert len([k for k in s if k[0] == "jaxmon_process_device_memory_bytes"]) == 4
