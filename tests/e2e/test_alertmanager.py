"""The whole alerting chain: deploy/prometheus/alerts.yml in a real Prometheus, sending to a real Alertmanager
(Debian `prometheus-alertmanager`) configured by deploy/alertmanager/alertmanager.yml, notifying a webhook receiver
in this process. Everything listens on loopback on free ports; the Alertmanager has its own storage directory and
no cluster.

Prometheus's target is a static exposition served from this process: what is under test is the rules and the
Alertmanager configuration, not the exporter. It shows a GPU that NVML lost (JaxmonGpuLost) with an Xid 79, an
uncorrected ECC error and a temperature over 85 °C (JaxmonGpuXidError, JaxmonGpuEccUncorrected, JaxmonGpuHot),
beside a healthy GPU. The rules' `for:` are shortened to 1 s (so that the device's alerts fire together, which
is the case inhibition is for) and the route's group_wait to 1 s; nothing else in either file changes.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

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


@pytest.fixture
def chain(tmp_path: Path) -> Iterator[tuple[Prometheus, Alertmanager, _Server]]:
    target = _Server(EXPOSITION)
    webhook = _Server()
    alertmanager: Alertmanager | None = None
    prometheus: Prometheus | None = None
    try:
        alertmanager = Alertmanager(tmp_path, alertmanager_config(webhook.url + "/hook"))
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
        prometheus.wait_ready()
        yield prometheus, alertmanager, webhook
    finally:
        if prometheus is not None:
            prometheus.stop()
        if alertmanager is not None:
            alertmanager.stop()
        target.stop()
        webhook.stop()


def test_a_lost_gpu_sends_one_notification(chain: tuple[Prometheus, Alertmanager, _Server]) -> None:
    prometheus, alertmanager, webhook = chain
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
