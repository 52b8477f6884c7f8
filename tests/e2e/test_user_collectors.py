"""The embedded exporter over real HTTPS while a user's prometheus_client collector hangs in collect(): the
scrape that waits for it holds no one else up; new connections complete their TLS handshake and /healthz answers.
The deadline, a raising collector and what each scrape serves are tested in-process (tests/unit/test_web_app.py)."""

from __future__ import annotations

import threading
from pathlib import Path

import requests
import yaml

from tests.conftest import ROOT, parse_samples, sample
from tests.helpers import Child
from tests.tls_helpers import make_certs, tls_request

SCRIPT = ROOT / "tests" / "workloads" / "stuck_collector.py"


def test_a_stuck_user_collector_holds_up_no_handshake_and_no_healthz(children: list[Child], tmp_path: Path) -> None:
    certs = make_certs(tmp_path)
    web = tmp_path / "web.yml"
    web.write_text(
        yaml.safe_dump({"tls_server_config": {"cert_file": str(certs.server_cert), "key_file": str(certs.server_key)}})
    )
    env = {
        "JAXMON_WEB__CONFIG__FILE": str(web),
        "JAXMON_COLLECTOR__DEFAULT_REGISTRY__TIMEOUT": "60s",  # the scrape waits for the collector all along
        "JAXMON_POLL__INTERVAL": "0.5s",
    }
    child = Child(tmp_path, script=SCRIPT, env=env)
    children.append(child)
    url, port = child.hello["url"], child.hello["port"]
    assert url.startswith("https://")
    scraped: list[requests.Response] = []
    scrape = threading.Thread(
        target=lambda: scraped.append(requests.get(url + "/metrics", verify=str(certs.server_ca), timeout=90)),
        daemon=True,
    )
    scrape.start()
    assert child.send("entered") == {"entered": True}
    # A fresh connection: its handshake and its request are served while the scrape still waits (on the old tree
    # the collector ran on the event loop, and this timed out).
    status, _ = tls_request(port, ca=certs.server_ca, path="/healthz")
    assert status == 200
    assert scrape.is_alive() and not scraped
    assert child.send("release") == {"released": True}
    scrape.join(60)
    (response,) = scraped
    s = parse_samples(response.text)
    assert sample(s, "stuck_value") == 1 and any(name == "jaxmon_build_info" for name, _ in s)
    assert child.send("exit") == {"stopped": True}
