"""/debug/pprof/device_memory: a workload's live device buffers as a pprof profile, and when there is none."""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import yaml

from tests.conftest import FIXTURES, StartDaemon
from tests.helpers import Child
from tests.pprof import parse_profile
from tests.tls_helpers import bcrypt_hash

PATH = "/debug/pprof/device_memory"
# A size no JAX buffer of the toy loop has: 308,641 float32 values.
DISTINCT_BYTES = 1_234_564


@pytest.fixture
def child(tmp_path: Path) -> Iterator[Child]:
    web = tmp_path / "web.yml"
    web.write_text(yaml.safe_dump({"basic_auth_users": {"prom": bcrypt_hash("pw")}}))
    c = Child(
        tmp_path,
        "embedded",
        "--workload",
        "toy",
        env={
            "JAXMON_COLLECTOR__PROBE": "false",
            "JAXMON_WEB__ENABLE_PROFILING": "true",
            "JAXMON_WEB__CONFIG__FILE": str(web),
        },
    )
    yield c
    c.close()


def test_an_embedded_exporter_serves_a_pprof_profile_holding_the_buffer_the_test_made(child: Child) -> None:
    """The profile is gzipped protobuf, behind the web config's basic auth, and lists the test's array by size."""
    child.send(f"alloc 2 {DISTINCT_BYTES}")
    url = child.hello["url"] + PATH
    assert PATH in requests.get(child.hello["url"] + "/", auth=("prom", "pw"), timeout=30).text  # linked
    assert requests.get(url, timeout=30).status_code == 401  # the same basic auth as /metrics

    r = requests.get(url, auth=("prom", "pw"), timeout=30)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/octet-stream"
    assert r.content[:2] == b"\x1f\x8b"  # gzip, as go tool pprof reads it
    profile = parse_profile(gzip.decompress(r.content))
    ours = [s for s in profile.samples if profile.value(s, "space") == DISTINCT_BYTES]
    assert len(ours) == 1, [(s.values, s.labels) for s in profile.samples]
    assert profile.value(ours[0], "allocations") == 1
    assert ours[0].labels == {"kind": "buffer", "device": "cpu:2"}  # a buffer, on the device the test put it

    again = requests.get(url, auth=("prom", "pw"), timeout=30)
    assert again.status_code == 429  # a scraper loop cannot stall training
    assert 1 <= int(again.headers["retry-after"]) <= 5


def test_a_sidecar_answers_404_saying_it_holds_no_workload(start_daemon: StartDaemon) -> None:
    """With profiling on but no workload in the process there is nothing to profile, and the answer says so."""
    d = start_daemon("--replay", str(FIXTURES / "shapes.json"), "--web.enable-profiling")
    r = d.get(PATH)
    assert r.status_code == 404
    assert "no workload runs in this process" in r.text
    assert PATH not in d.get("/").text  # not linked where it cannot answer


def test_profiling_is_off_by_default(start_daemon: StartDaemon) -> None:
    """Without --web.enable-profiling the path answers 404 naming the flag, and the landing page omits it."""
    d = start_daemon("--replay", str(FIXTURES / "shapes.json"))
    r = d.get(PATH)
    assert r.status_code == 404
    assert "--web.enable-profiling" in r.text
    assert PATH not in d.get("/").text
