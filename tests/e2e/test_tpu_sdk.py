"""libtpu's monitoring SDK read in a child process (jaxmon/sources/libtpu/sdk.py) against a stand-in SDK with the
real one's functions and data formats (tests/sdk_standin/libtpu/sdk/tpumonitoring.py), put on the child's
PYTHONPATH and driven by a scenario file the test rewrites: the child reads tensorcore_util, and the reader
survives the SDK's crash (os._exit, a segfault) and hang, says why, and recovers. Then the daemon end to end: a
real `jaxmon serve --collector.tpu` beside tests/fake_libtpu.py, scraped over HTTP.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jaxmon.families.libtpu import sdk_families
from jaxmon.sources.libtpu import sdk, sdk_state
from tests.conftest import ROOT, Samples, StartDaemon, sample
from tests.fake_libtpu import Chip, FakeLibtpu, Scenario
from tests.helpers import Daemon

STANDIN = Path(__file__).resolve().parents[1] / "sdk_standin"
GIB = 1 << 30
IDS = (8, 9, 12, 13)
ASK = (sdk.TENSORCORE_UTIL, *sdk.PER_CHIP)


class SdkScenario:
    """The stand-in's scenario file."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, **scenario: Any) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(scenario))
        os.replace(tmp, self.path)  # the child never reads half a file

    def env(self) -> dict[str, str]:
        # A daemon with libtpu on its path runs its own JAX on CPU beside the job that holds the chips.
        return {"PYTHONPATH": str(STANDIN), "JAXMON_TEST_SDK_SCENARIO": str(self.path), "JAX_PLATFORMS": "cpu"}


def util(*percent: float) -> dict[str, list[str]]:
    return {"tensorcore_util": [f"{p:g}" for p in percent], "hbm_capacity_total": [str(16 * GIB)] * len(percent)}


@pytest.fixture
def scenario(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SdkScenario:
    sc = SdkScenario(tmp_path / "sdk.json")
    sc.write(metrics=util(12.5, 50, 75, 100))
    for name, value in sc.env().items():
        monkeypatch.setenv(name, value)
    return sc


@pytest.fixture
def child() -> Iterator[sdk.SdkChild]:
    c = sdk.SdkChild(timeout=1.0, start_timeout=20.0)
    yield c
    c.close()


def until(c: sdk.SdkChild, status: str, timeout: float = 30.0) -> sdk.SdkReading:
    """Poll as the collector does until the reading has `status`."""
    end = time.monotonic() + timeout
    while True:
        r = c.read(ASK)
        if r.status == status:
            return r
        assert time.monotonic() < end, f"still {r.status} ({r.detail}), waiting for {status}"
        time.sleep(0.1)


def test_the_child_reads_tensorcore_util_and_survives_the_sdks_crashes_and_hangs(
    scenario: SdkScenario, child: sdk.SdkChild
) -> None:
    r = until(child, "ok")
    assert r.data[sdk.TENSORCORE_UTIL] == ("12.5", "50", "75", "100")
    assert sdk.percents(r.data[sdk.TENSORCORE_UTIL]) == [0.125, 0.5, 0.75, 1.0]
    assert "tpu_throttle_score" in r.supported and r.version == "0.0.0+standin"
    assert child.starts == 1
    # Values follow the SDK, from the same child; a chatty SDK writing to fd 1 does not break the protocol.
    scenario.write(metrics=util(1, 2, 3, 4), stdout="libtpu says hello\n")
    assert until(child, "ok").data[sdk.TENSORCORE_UTIL] == ("1", "2", "3", "4")
    assert child.starts == 1

    for how, why in (("segfault", "killed by signal 11"), ("exit", "exited with status 3")):
        scenario.write(metrics=util(1), on_data=how)
        r = until(child, "crashed")
        assert why in r.detail and not r.data
        scenario.write(metrics=util(33))
        assert until(child, "ok").data[sdk.TENSORCORE_UTIL] == ("33",)

    scenario.write(metrics=util(1), on_data="hang", hang_seconds=30)
    t0 = time.monotonic()
    r = until(child, "timeout")
    assert time.monotonic() - t0 < 5.0, "a hung SDK held the reader past its deadline"
    assert "did not answer within 1 s" in r.detail
    scenario.write(metrics=util(44))
    assert until(child, "ok").data[sdk.TENSORCORE_UTIL] == ("44",)
    assert child.starts == 4  # one per crash and hang, and no more


def test_an_import_that_fails_hangs_or_finds_no_libtpu_is_a_status(
    scenario: SdkScenario, monkeypatch: pytest.MonkeyPatch
) -> None:
    scenario.write(on_import="raise")
    c = sdk.SdkChild(timeout=0.5, start_timeout=20.0)
    try:
        r = until(c, "import_failed")
        assert "RuntimeError" in r.detail
    finally:
        c.close()
    # An import that hangs reads "starting" within each poll's deadline, then "timeout" past the start deadline.
    scenario.write(on_import="hang", hang_seconds=30)
    c = sdk.SdkChild(timeout=0.3, start_timeout=2.0)
    try:
        t0 = time.monotonic()
        assert c.read(ASK).status == "starting"
        assert time.monotonic() - t0 < 1.0
        r = until(c, "timeout")
        assert "import took longer than 2 s" in r.detail
    finally:
        c.close()
    monkeypatch.setenv("PYTHONPATH", "")
    c = sdk.SdkChild(timeout=1.0, start_timeout=20.0)
    try:
        r = until(c, "not_installed")
        assert "No module named 'libtpu'" in r.detail
        assert c.read(ASK).status == "not_installed" and c.starts == 1  # not looked for again at once
    finally:
        c.close()


def test_an_sdk_with_no_values_reads_empty(scenario: SdkScenario, child: sdk.SdkChild) -> None:
    # As on the lent v5e: every metric listed, every data() [].
    scenario.write(metrics={})
    r = until(child, "empty")
    assert r.data == {name: () for name in ASK}


def test_a_child_that_cannot_be_started_is_a_status_counted_and_tried_again_after_a_back_off(tmp_path: Path) -> None:
    """No child process can be started (here: its interpreter is missing; fork's EAGAIN at a pids limit and a
    missing temporary directory raise the same way): read() says spawn_failed with why, counts it, does not try
    again before the back-off, and leaves nothing open."""
    child = sdk.SdkChild(timeout=0.5, python=str(tmp_path / "no-python"))
    first = child.read((sdk.TENSORCORE_UTIL,))
    assert first.status == "spawn_failed" and "FileNotFoundError" in first.detail
    assert (child.spawn_failures, child.starts) == (1, 0)
    assert child.read((sdk.TENSORCORE_UTIL,)) == first and child.spawn_failures == 1  # in the back-off: no retry
    assert child._stderr is None and child._proc is None
    child._retry_at = 0.0  # the back-off has passed
    child.read((sdk.TENSORCORE_UTIL,))
    assert child.spawn_failures == 2 and child._backoff == 4.0  # doubling, as for a crash
    state = sdk_state.state(first, child.starts, [], child.spawn_failures)
    assert state.spawn_failures == 2
    samples = {(s.name, s.labels.get("status")): s.value for f in sdk_families(state) for s in f.samples}
    assert samples[("jaxmon_libtpu_sdk_status", "spawn_failed")] == 1
    assert samples[("jaxmon_libtpu_sdk_child_spawn_failures_total", None)] == 2


SPAWN_CASE = """
import os, resource, sys, tempfile
from jaxmon.sources.libtpu import sdk
if sys.argv[1] == "pids":
    if os.geteuid() == 0:  # root's processes are not limited: an unprivileged uid's are
        os.setgid(65534)
        os.setuid(65534)
    resource.setrlimit(resource.RLIMIT_NPROC, (1, 1))  # this process is the uid's one: fork says EAGAIN
else:
    tempfile.tempdir = sys.argv[2]  # no usable temporary directory
child = sdk.SdkChild(timeout=0.5)
first = child.read((sdk.TENSORCORE_UTIL,))
print(first.status, child.spawn_failures, child._proc is None and child._stderr is None, first.detail, sep="|")
"""


@pytest.mark.parametrize("case", ["pids", "no-temporary-directory"])
def test_a_pids_limit_and_no_temporary_directory_are_each_a_spawn_failure(tmp_path: Path, case: str) -> None:
    """The two causes of a failed start a pod meets, made for real in a process of their own: fork's EAGAIN at a
    process limit (RLIMIT_NPROC, as a pod's pids limit reads to fork), and no usable temporary directory for the
    child's stderr. Each is spawn_failed, with why, counted, and leaves nothing open."""
    result = subprocess.run(
        [sys.executable, "-c", SPAWN_CASE, case, str(tmp_path / "gone")],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    status, failures, closed, detail = result.stdout.strip().split("|", 3)
    assert (status, failures, closed) == ("spawn_failed", "1", "True"), result.stdout
    assert ("BlockingIOError" if case == "pids" else "FileNotFoundError") in detail, detail


# The daemon end to end.


def core_labels(dev: int, core: int) -> dict[str, str]:
    return {"device": str(dev), "platform": "tpu", "source": "libtpu", "core": str(core)}


def status(samples: Samples) -> str | None:
    on = [dict(k[1])["status"] for k, v in samples.items() if k[0] == "jaxmon_libtpu_sdk_status" and v == 1]
    return on[0] if len(on) == 1 else None


def test_the_daemon_serves_tensorcore_utilization_and_outlives_the_sdk(
    start_daemon: StartDaemon, tmp_path: Path
) -> None:
    sc = SdkScenario(tmp_path / "sdk.json")
    sc.write(metrics=util(10, 20, 30, 40))
    chips = {dev: Chip(total_bytes=16 * GIB, used_bytes=GIB, duty_cycle_pct=90.0) for dev in IDS}
    fake = FakeLibtpu(Scenario(chips=chips)).start()
    try:
        daemon = start_daemon(
            "--no-collector.probe", "--collector.tpu", "--collector.tpu.address", fake.address,
            "--collector.tpu.timeout", "300ms", "--collector.tpu.sdk-timeout", "500ms", "--poll.interval", "0.3s",
            env=sc.env(),
        )  # fmt: skip
        s = daemon.wait_for(lambda s: status(s) == "ok" and len(cores(s)) == 4, what="four TensorCores")
        # The SDK's cores in order are libtpu's device-ids in order (one core a chip here).
        for i, dev in enumerate(IDS):
            assert sample(s, "jaxmon_device_tensorcore_utilization_ratio", **core_labels(dev, i)) == pytest.approx(
                (i + 1) / 10
            )
        assert sample(s, "jaxmon_collector_success", collector="tpu") == 1

        sc.write(metrics=util(10), on_data="segfault")
        s = daemon.wait_for(lambda s: status(s) == "crashed", what="the SDK child crashed")
        assert not cores(s)
        # The gRPC series stay, the poll is whole, and the daemon lives on.
        assert sample(s, "jaxmon_device_duty_cycle_ratio", device="8", platform="tpu", source="libtpu") == 0.9
        assert sample(s, "jaxmon_collector_success", collector="tpu") == 1
        sc.write(metrics=util(10), on_data="hang", hang_seconds=30)
        daemon.wait_for(lambda s: status(s) == "timeout", what="the SDK child timed out")
        sc.write(metrics=util(60, 60, 60, 60))
        s = daemon.wait_for(lambda s: status(s) == "ok" and len(cores(s)) == 4, what="the SDK read again")
        starts = sample(s, "jaxmon_libtpu_sdk_child_starts_total", source="libtpu")
        assert starts is not None and starts >= 3
        assert daemon.alive()
        assert "libtpu monitoring SDK status" in daemon.log()
        # One child at a time, and none outlives the daemon, even one killed with no chance to stop it, even one
        # hung in libtpu: here the next child hangs in its import, as the daemon is killed.
        sc.write(metrics=util(10), on_data="segfault", on_import="hang", hang_seconds=60)
        daemon.wait_for(lambda s: status(s) == "starting", what="a child hung in its import")
        (child,) = sdk_children(daemon.proc.pid)
        daemon.stop(signal.SIGKILL)
        end = time.monotonic() + 10
        while running(child):
            assert time.monotonic() < end, "the SDK child outlived the daemon"
            time.sleep(0.1)
    finally:
        fake.stop()


def sdk_children(parent: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (entry / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == parent and b"sdk_child.py" in cmdline:
            out.append(int(entry.name))
    return out


def running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def cores(samples: Samples) -> list[Any]:
    return [k for k in samples if k[0] == "jaxmon_device_tensorcore_utilization_ratio"]


def test_a_child_that_cannot_be_started_costs_the_sdk_series_alone(tmp_path: Path) -> None:
    """The daemon cannot start the SDK's child (here its interpreter went away under it: the daemon runs from a
    link to the venv's python that the test removes; fork's EAGAIN at a pod's pids limit and a missing temporary
    directory raise from the same start): the status says spawn_failed, the failed starts are counted, the status is
    logged once however often the start is tried again (after a back-off), and the tpu collector's poll stays whole,
    its gRPC series flowing. Once the interpreter is back, the child starts again."""
    assert sys.prefix != sys.base_prefix, "the suite runs in its venv (tests/run.sh)"
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    shutil.copy(Path(sys.prefix) / "pyvenv.cfg", venv)
    (venv / "lib").symlink_to(Path(sys.prefix) / "lib")
    python = venv / "bin" / "python"
    python.symlink_to(sys.executable)
    sc = SdkScenario(tmp_path / "sdk.json")
    sc.write(metrics=util(10, 20, 30, 40))
    chips = {dev: Chip(total_bytes=16 * GIB, used_bytes=GIB, duty_cycle_pct=90.0) for dev in IDS}
    fake = FakeLibtpu(Scenario(chips=chips)).start()
    args = [
        "--no-collector.probe", "--collector.tpu", "--collector.tpu.address", fake.address,
        "--collector.tpu.timeout", "300ms", "--collector.tpu.sdk-timeout", "500ms", "--poll.interval", "0.3s",
    ]  # fmt: skip
    daemon = Daemon(tmp_path, args, sc.env(), python=str(python))
    try:
        daemon.wait_ready()
        daemon.wait_for(lambda s: status(s) == "ok", what="the SDK read")
        python.unlink()
        sc.write(metrics=util(10), on_data="segfault")  # the child dies at its next read; no new one can start
        s = daemon.wait_for(
            lambda s: (sample(s, "jaxmon_libtpu_sdk_child_spawn_failures_total", source="libtpu") or 0) >= 2,
            timeout=60,
            what="two failed starts",
        )
        assert status(s) == "spawn_failed"
        assert sample(s, "jaxmon_collector_success", collector="tpu") == 1
        assert sample(s, "jaxmon_device_duty_cycle_ratio", device="8", platform="tpu", source="libtpu") == 0.9
        assert not cores(s)
        logged = [line for line in daemon.log().splitlines() if "spawn_failed" in line]
        assert len(logged) == 1 and "FileNotFoundError" in logged[0], logged
        python.symlink_to(sys.executable)
        sc.write(metrics=util(60, 60, 60, 60))
        daemon.wait_for(lambda s: status(s) == "ok" and len(cores(s)) == 4, timeout=60, what="the SDK read again")
        assert daemon.alive()
    finally:
        daemon.stop(signal.SIGKILL)
        fake.stop()
