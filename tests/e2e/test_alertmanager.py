"""The whole alerting chain: deploy/prometheus/alerts.yml in a real Prometheus, sending to a real Alertmanager
(Debian `prometheus-alertmanager`) configured by deploy/alertmanager/alertmanager.yml, notifying a webhook receiver
in this process. Everything listens on loopback on free ports; the Alertmanager has its own storage directory and
no cluster.

Prometheus's target is a static exposition served from this process: what is under test is the rules and the
Alertmanager configuration, not the exporter. The first shows a GPU that NVML lost (JaxmonGpuLost) with an Xid 79,
an uncorrected ECC error and a temperature over 85 °C (JaxmonGpuXidError, JaxmonGpuEccUncorrected, JaxmonGpuHot),
beside a healthy GPU. The second is a sidecar whose own JAX GPU devices NVML also reads: no machine here has a GPU
(JAX's devices are CPU devices, and a replayed device runs no probe), so its exposition is rendered by jaxmon's own
code from the states a real GPU host would give it (`sidecar_exposition`): the exposition's jaxmon_device_info of
the JAX devices, the probe's jaxmon_device_up with the labels the probe collector gives them, the memory
collector's families, and the nvml collector's `render` with `match_devices`' answer for that host. The rules'
`for:` are shortened to 1 s (so that the device's alerts fire together, which is the case inhibition is for) and
the route's group_wait to 1 s; nothing else in either file changes.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from jaxmon.allocator import MemoryNumbers
from jaxmon.collectors.nvml import NvmlState, match_devices, render
from jaxmon.device_readings import DeviceInfo, MemoryReading
from jaxmon.exposition import base_families, merged, status_families
from jaxmon.families import add
from jaxmon.families.memory import MemoryRow, memory_families
from jaxmon.families.probe import PROBE_METRICS
from jaxmon.snapshot import CollectorStatus, Snapshot
from jaxmon.sources.nvml import GpuReading
from tests.conftest import ROOT
from tests.deploy_files import RULES
from tests.helpers import wait_until
from tests.prometheus import LoopbackServer, Prometheus

ALERTMANAGER_CONFIG = ROOT / "deploy" / "alertmanager" / "alertmanager.yml"
LOST_GPU = "1"
GPU = 'platform="gpu", source="nvml"'
EXPOSITION = f"""\
jaxmon_device_source_up{{{GPU}, device="0"}} 1
jaxmon_device_source_up{{{GPU}, device="{LOST_GPU}"}} 0
jaxmon_device_xid_errors_total{{{GPU}, device="{LOST_GPU}", xid="79"}} 1
jaxmon_device_ecc_errors_total{{{GPU}, device="{LOST_GPU}", kind="uncorrected"}} 2
jaxmon_device_ecc_errors_total{{{GPU}, device="0", kind="uncorrected"}} 0
jaxmon_device_temperature_celsius{{{GPU}, device="0"}} 60
jaxmon_device_temperature_celsius{{{GPU}, device="{LOST_GPU}"}} 95
"""
# The device's alerts besides JaxmonGpuLost, each firing in Prometheus and silenced in Alertmanager.
SILENCED = {"JaxmonGpuXidError", "JaxmonGpuEccUncorrected", "JaxmonGpuHot"}


class _Families(Collector):
    """Families rendered by jaxmon's code, for prometheus_client's text format."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from self.families


def sidecar_exposition() -> str:
    """What `jaxmon serve` exports on a host with three GPUs, CUDA_DEVICE_ORDER=PCI_BUS_ID and no
    CUDA_VISIBLE_DEVICES (so the nvml collector matches NVML's GPUs to its JAX devices: pci_bus_order): GPU 1 has
    fallen off the bus, so NVML reads it as lost (it had read its identity before), and its JAX device gpu:1 fails
    its probe and its memory_stats(); gpu:2 does not answer its probe while NVML reads its GPU fine; gpu:0 is
    well. The probe and memory collectors fail (a device of theirs does), the nvml collector succeeds (NVML
    answers)."""
    devices = tuple(DeviceInfo(id=i, platform="gpu", device_kind="NVIDIA H200") for i in range(3))
    now = time.time()
    statuses = {
        name: CollectorStatus(success=success, duration_seconds=0.01, last_success_timestamp=now - 30)
        for name, success in (("memory", False), ("probe", False), ("nvml", True))
    }
    snap = Snapshot(devices=devices, source="local", statuses=statuses)
    match = match_devices(devices, 3, {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
    assert match.how == "pci_bus_order"
    gpus = tuple(
        GpuReading(
            index=i,
            name="NVIDIA H200",
            uuid=f"GPU-{i:08x}-1111-2222-3333-{i:012x}",
            pci_bus_id=f"00000000:{0x18 + i:02X}:00.0",
            error="NVMLError_GpuIsLost: GPU is lost" if i == 1 else None,
            temperature_celsius=None if i == 1 else 60.0,
        )
        for i in range(3)
    )
    # The probe collector's jaxmon_device_up: the device's own labels (snap.device_labels), 1 or 0.
    spec = PROBE_METRICS[0].family
    assert spec.name == "jaxmon_device_up"
    device_up = spec.new()
    for dev, up in zip(devices, (1.0, 0.0, 0.0), strict=True):
        add(device_up, snap.device_labels(dev), up)
    well = MemoryReading(MemoryNumbers(supported=True, bytes_in_use=1 << 30, limit_bytes=100 << 30))
    lost = MemoryReading(None, error="XlaRuntimeError: INTERNAL: device lost")
    memory = memory_families(
        [MemoryRow(snap.device_labels(d), *((lost, 12) if d.id == 1 else (well, 0))) for d in devices]
    )
    nvml = render(NvmlState(gpus=gpus, match=match), {})
    families = merged([*base_families(snap), device_up, *memory, *nvml, *status_families(snap, statuses)])
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(families))
    return generate_latest(registry).decode()


def _binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise AssertionError(
            f"{name} not found: install the Debian package 'prometheus-alertmanager' (tests/run.sh does)"
        )
    return path


def test_amtool_accepts_the_shipped_configuration() -> None:
    result = subprocess.run(
        [_binary("amtool"), "check-config", str(ALERTMANAGER_CONFIG)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout and "5 inhibit rules" in result.stdout, result.stdout


class _Server(ThreadingHTTPServer):
    """A loopback HTTP server on its own thread: serves `exposition` on GET, records the JSON bodies POSTed."""

    def __init__(self, exposition: str = "") -> None:
        self.exposition = exposition.encode()
        self.received: list[dict[str, Any]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(server.exposition)))
                self.end_headers()
                self.wfile.write(server.exposition)

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                server.received.append(json.loads(body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


class Alertmanager(LoopbackServer):
    """The Debian `prometheus-alertmanager` on loopback with its own storage directory and no cluster."""

    name = "alertmanager"

    def __init__(self, tmp: Path, config: dict[str, Any]) -> None:
        args = [f"--storage.path={tmp / 'alertmanager-data'}", "--cluster.listen-address=", "--log.level=warn"]
        super().__init__(tmp, config, _binary("prometheus-alertmanager"), args)

    def alerts(self) -> list[dict[str, Any]]:
        r = requests.get(self.url + "/api/v2/alerts", timeout=10)
        r.raise_for_status()
        alerts: list[dict[str, Any]] = r.json()
        return alerts


def shortened_alerts(tmp: Path) -> Path:
    """alerts.yml with every `for:` at 1 s."""
    text = re.sub(r"\bfor: \d+[smh]\b", "for: 1s", RULES.read_text(encoding="utf-8"))
    path = tmp / "alerts.yml"
    path.write_text(text, encoding="utf-8")
    return path


def alertmanager_config(webhook: str) -> dict[str, Any]:
    """The shipped configuration, its receivers pointed at `webhook` and the route's waits shortened."""
    config: dict[str, Any] = yaml.safe_load(ALERTMANAGER_CONFIG.read_text(encoding="utf-8"))
    for receiver in config["receivers"]:
        receiver["webhook_configs"] = [{"url": webhook, "send_resolved": False}]
    config["route"].update(group_wait="1s", group_interval="1m", repeat_interval="1h")
    return config


Chain = tuple[Prometheus, Alertmanager, _Server]


@pytest.fixture
def start_chain(tmp_path: Path) -> Iterator[Callable[[str], Chain]]:
    """Starts the chain with Prometheus scraping `exposition`; stops every part of it at the end of the test, each
    whatever stopping the others raised (a server left running outlives the suite)."""
    with contextlib.ExitStack() as stack:

        def start(exposition: str) -> Chain:
            target = _Server(exposition)
            stack.callback(target.stop)
            webhook = _Server()
            stack.callback(webhook.stop)
            alertmanager = Alertmanager(tmp_path, alertmanager_config(webhook.url + "/hook"))
            stack.callback(alertmanager.stop)
            alertmanager.wait_ready()
            config: dict[str, Any] = {
                "global": {"scrape_interval": "1s", "scrape_timeout": "900ms", "evaluation_interval": "1s"},
                "rule_files": [str(shortened_alerts(tmp_path))],
                "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{alertmanager.port}"]}]}]},
                "scrape_configs": [
                    {
                        "job_name": "jaxmon",
                        "static_configs": [{"targets": [target.url.removeprefix("http://")]}],
                    }
                ],
            }
            prometheus = Prometheus(tmp_path, config)
            stack.callback(prometheus.stop)
            prometheus.wait_ready()
            return prometheus, alertmanager, webhook

        yield start


def test_a_lost_gpu_sends_one_notification(start_chain: Callable[[str], Chain]) -> None:
    prometheus, alertmanager, webhook = start_chain(EXPOSITION)
    # Prometheus fires every alert of the lost GPU, and sends them all to Alertmanager.
    expected = SILENCED | {"JaxmonGpuLost"}
    prometheus.wait_for(
        f'ALERTS{{alertstate="firing", device="{LOST_GPU}"}}',
        lambda r: {a["metric"]["alertname"] for a in r} == expected,
        "the lost GPU's alerts firing",
        timeout=60,
    )
    wait_until(
        lambda: {a["labels"]["alertname"] for a in alertmanager.alerts()} >= expected,
        30,
        "Alertmanager holds them",
        step=0.25,
        detail=lambda: json.dumps(alertmanager.alerts()),
    )
    # Alertmanager silences the others by its inhibition rules...
    states = {a["labels"]["alertname"]: a["status"] for a in alertmanager.alerts()}
    assert states["JaxmonGpuLost"]["state"] == "active", states
    for name in SILENCED:
        assert states[name]["state"] == "suppressed" and states[name]["inhibitedBy"], (name, states)
    # ... so the webhook receives one notification, with the one alert. Nothing more arrives in the next several
    # group_waits (1 s), where an uninhibited alert would have had its own notification.
    wait_until(lambda: len(webhook.received) >= 1, 30, "a notification", step=0.1)
    time.sleep(6)
    assert len(webhook.received) == 1, json.dumps(webhook.received, indent=1)
    (notification,) = webhook.received
    alerts = notification["alerts"]
    assert [(a["labels"]["alertname"], a["labels"]["device"], a["status"]) for a in alerts] == [
        ("JaxmonGpuLost", LOST_GPU, "firing")
    ], alerts
    assert notification["receiver"] == "jaxmon-page" and alerts[0]["labels"]["severity"] == "critical"
    # Short: the runbook is a link to its section of docs/alerts.md, not its text.
    assert alerts[0]["annotations"]["runbook_url"] == "docs/alerts.md#jaxmongpulost", alerts[0]
    assert set(alerts[0]["annotations"]) == {"summary", "description", "runbook_url"}, alerts[0]


def test_a_lost_gpu_that_a_jax_device_also_reads_sends_one_notification(
    start_chain: Callable[[str], Chain],
) -> None:
    """The sidecar's GPU 1 is lost: NVML's JaxmonGpuLost alone, not also its JAX device's JaxmonDeviceDown (a
    second page) and JaxmonDeviceMemoryUnreadable, nor the memory collector's JaxmonCollectorFailing; gpu:2, hung
    on a healthy GPU, still pages on its own. The for:s are 1 s here; that the JAX device's alert stays quiet
    through the minutes its 2m would end before JaxmonGpuLost's 5m is alerts_test.yml's case."""
    exposition = sidecar_exposition()
    # The JAX device's own series and the nvml collector's row of its GPU, as the rules join them.
    assert 'jaxmon_device_up{device="1",platform="gpu"} 0.0' in exposition, exposition
    assert 'jaxmon_memory_read_success{device="1",platform="gpu"} 0.0' in exposition, exposition
    assert 'jaxmon_device_source_up{device="1",platform="gpu",source="nvml"} 0.0' in exposition, exposition
    assert 'device="1",device_match="pci_bus_order",name="NVIDIA H200",pci_bus_id="00000000:19:00.0"' in exposition
    prometheus, alertmanager, webhook = start_chain(exposition)
    collectors = {("JaxmonCollectorFailing", "memory"), ("JaxmonCollectorFailing", "probe")}
    expected = {("JaxmonGpuLost", "1"), ("JaxmonDeviceDown", "2")} | collectors

    def held() -> dict[tuple[str, str], dict[str, Any]]:
        return {
            (a["labels"]["alertname"], a["labels"].get("device") or a["labels"].get("collector", "")): a["status"]
            for a in alertmanager.alerts()
        }

    # Both faults reach Alertmanager (each alert's for: is 1 s here), with the failing collectors ...
    wait_until(
        lambda: set(held()) >= expected,
        60,
        "both faults' alerts in Alertmanager",
        step=0.25,
        detail=lambda: str(held()),
    )
    # ... which it silences: probe under gpu:2's JaxmonDeviceDown and GPU 1's JaxmonGpuLost, memory under the latter.
    states = held()
    for key in collectors:
        assert states[key]["state"] == "suppressed" and states[key]["inhibitedBy"], (key, states)
    # ... and each sends its notification, to the paging receiver. Nothing more arrives in the next several
    # group_waits (1 s), where the lost GPU's JAX device would have had two more notifications of its own.
    wait_until(lambda: len(webhook.received) >= 2, 30, "two notifications", step=0.1)
    time.sleep(6)
    sent = [
        (n["receiver"], a["labels"]["alertname"], a["labels"].get("device", ""), a["status"])
        for n in webhook.received
        for a in n["alerts"]
    ]
    assert sorted(sent) == [
        ("jaxmon-page", "JaxmonDeviceDown", "2", "firing"),
        ("jaxmon-page", "JaxmonGpuLost", "1", "firing"),
    ], json.dumps(webhook.received, indent=1)
    assert len(webhook.received) == 2, json.dumps(webhook.received, indent=1)
    # Prometheus never raised the lost GPU's JAX alerts at all (not pending, not firing): left out in the rules.
    raised = prometheus.query('ALERTS{alertname=~"JaxmonDeviceDown|JaxmonDeviceMemoryUnreadable"}')
    assert {(r["metric"]["alertname"], r["metric"]["device"]) for r in raised} == {("JaxmonDeviceDown", "2")}, raised
