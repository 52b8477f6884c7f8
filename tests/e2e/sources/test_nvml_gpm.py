"""The NVML source's GPM reader (jaxmon/sources/nvml/gpm.py) through NVML's real C ABI: pynvml's GPM bindings call
the fake libnvidia-ml.so.1 (tests/fakenvml), which keeps each sample's scenario values and timestamp, refuses an
interval under 100 ms as NVML does, and counts its live samples in its state file.

Sleeps here only make an interval longer than NVML's 100 ms floor; nothing asserts a duration.
"""

from __future__ import annotations

import ctypes
import time
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from jaxmon.sources.nvml import GPM_METRICS, GpuReading, Nvml
from tests.fakenvml import GPM_IDS, GPU_IS_LOST, SONAME, Scenario, build, device, gpm, gpm_metrics, mig_device

FLOOR = 0.1
ARGUMENT_VERSION_MISMATCH = 25
FUNCTION_NOT_FOUND = 13
UNKNOWN = 999


@pytest.fixture(scope="module", autouse=True)
def fake_library() -> None:
    ctypes.CDLL(str(build() / SONAME))


@pytest.fixture
def scenario(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Scenario:
    scenario = Scenario(tmp_path / "scenario.json", [device(0), device(1)])
    for key, value in scenario.env().items():
        monkeypatch.setenv(key, value)
    return scenario


def expected(index: int, **percent: float) -> dict[int, float]:
    """The ratios jaxmon reports for GPU `index`'s scenario GPM values: percent / 100, by metric id."""
    return {int(metric): value / 100 for metric, value in gpm_metrics(index, **percent).items()}


def interval(nvml: Nvml) -> list[GpuReading]:
    """A poll past NVML's floor since the last one."""
    time.sleep(FLOOR + 0.02)
    return nvml.read_all()


def live(scenario: Scenario) -> int:
    return scenario.state().get("gpm_live_samples", 0)


def count(scenario: Scenario, what: str) -> int:
    """One of the fake's counts since it loaded (this process loads it once: compare differences)."""
    return scenario.state().get(what, 0)


def test_gpm_values_are_the_scenarios_over_the_interval_between_two_samples(scenario: Scenario, nvml: Nvml) -> None:
    first = nvml.read_all()
    # One sample is no interval: supported, no values yet.
    assert [(g.gpm_supported, g.gpm) for g in first] == [(True, None), (True, None)]
    zero, one = interval(nvml)
    assert dict(zero.gpm or ()) == expected(0)
    assert dict(one.gpm or ()) == expected(1)
    assert set(dict(zero.gpm or ())) == set(GPM_METRICS), "every metric jaxmon asks for, in one call"
    # A new value reaches the reading once a sample taken after the change ends the interval.
    scenario.update(1, gpm=gpm(1, sm_active=12.5, tensor_active=3.0))
    _, one = interval(nvml)
    assert dict(one.gpm or ()) == expected(1, sm_active=12.5, tensor_active=3.0)
    # Two samples per GPU, reused in turn: none allocated per poll.
    allocated = count(scenario, "gpm_allocated")
    for _ in range(3):
        interval(nvml)
    assert count(scenario, "gpm_allocated") == allocated
    assert live(scenario) == 4
    assert count(scenario, "gpm_short_intervals") == count(scenario, "gpm_bad_samples") == 0


def test_a_metric_that_fails_is_absent_never_zero(scenario: Scenario, nvml: Nvml) -> None:
    scenario.update(0, gpm=gpm(0, errors={"pipe_fp32": UNKNOWN, "tensor_active": 3}))
    nvml.read_all()
    zero, one = interval(nvml)
    values = dict(zero.gpm or ())
    want = expected(0)
    del want[GPM_IDS["pipe_fp32"]], want[GPM_IDS["tensor_active"]]
    assert values == want
    assert dict(one.gpm or ()) == expected(1)
    assert zero.up and zero.gpm_supported


def test_an_interval_under_100_ms_is_never_asked_for(scenario: Scenario, nvml: Nvml) -> None:
    """Polls faster than NVML's floor keep the older sample (and the last values) until 100 ms have passed: the
    fake, which refuses a shorter interval and counts each one asked for, is never asked."""

    for _ in range(40):
        for gpu in nvml.read_all():
            assert gpu.gpm is None or dict(gpu.gpm) == expected(gpu.index)
    zero, _ = interval(nvml)
    assert dict(zero.gpm or ()) == expected(0)
    assert count(scenario, "gpm_short_intervals") == 0
    assert live(scenario) == 4


@pytest.mark.parametrize(
    ("gpm_entry", "fields", "why"),
    [
        ({"supported": False}, {}, "isSupportedDevice = 0"),
        (None, {"not_supported": ["gpm"]}, "NVML_ERROR_NOT_SUPPORTED"),
        (None, {"fail": {"gpm": FUNCTION_NOT_FOUND}}, "NVML_ERROR_FUNCTION_NOT_FOUND"),
        (None, {"fail": {"gpm": ARGUMENT_VERSION_MISMATCH}}, "NVML_ERROR_ARGUMENT_VERSION_MISMATCH"),
        (None, {"fail": {"gpm_metrics": ARGUMENT_VERSION_MISMATCH}}, "NVML_ERROR_ARGUMENT_VERSION_MISMATCH"),
    ],
    ids=["is-supported-0", "not-supported", "function-not-found", "version-mismatch", "metrics-version-mismatch"],
)
def test_each_way_gpm_says_unsupported_gives_no_values_and_one_log_line(
    scenario: Scenario, nvml: Nvml, gpm_entry: dict[str, bool] | None, fields: dict[str, object], why: str
) -> None:
    if gpm_entry is not None:
        scenario.update(1, gpm=gpm_entry)
    scenario.update(1, **fields)
    with capture_logs() as logs:
        for _ in range(4):
            zero, one = interval(nvml)
    assert (one.up, one.gpm_supported, one.gpm) == (True, False, None)
    assert dict(zero.gpm or ()) == expected(0), "the other GPU keeps its GPM"
    said = [e for e in logs if "GPM unsupported" in e["event"]]
    assert [(e["gpu"], e["log_level"]) for e in said] == [(1, "info")], "said once, for that GPU"
    assert why in said[0]["reason"]
    assert live(scenario) == 2, "the unsupported GPU holds no samples"


def test_true_logs_an_unsupported_gpu_as_a_warning_and_false_never_asks(scenario: Scenario) -> None:
    scenario.update(1, gpm={"supported": False})
    insisting = Nvml(xid_wait_seconds=0.05, gpm=True)
    insisting.open()
    try:
        with capture_logs() as logs:
            insisting.read_all()
        assert [(e["gpu"], e["log_level"]) for e in logs if "GPM unsupported" in e["event"]] == [(1, "warning")]
    finally:
        insisting.close()
    allocated = count(scenario, "gpm_allocated")
    off = Nvml(xid_wait_seconds=0.05, gpm=False)
    off.open()
    try:
        off.read_all()
        readings = interval(off)
    finally:
        off.close()
    assert [(g.gpm_supported, g.gpm) for g in readings] == [(None, None), (None, None)]
    assert count(scenario, "gpm_allocated") == allocated, "no sample allocated"


def test_samples_are_freed_when_a_gpu_is_lost_taken_afresh_when_it_returns_and_freed_on_close(
    scenario: Scenario,
) -> None:
    allocated, freed = count(scenario, "gpm_allocated"), count(scenario, "gpm_freed")
    nvml = Nvml(xid_wait_seconds=0.05)
    nvml.open()
    nvml.read_all()
    interval(nvml)
    assert live(scenario) == nvml.gpm_samples() == 4
    scenario.update(1, error=GPU_IS_LOST)
    _, one = interval(nvml)
    assert not one.up and one.gpm is None and one.gpm_supported is None
    assert live(scenario) == nvml.gpm_samples() == 2, "the lost GPU's two samples freed"
    scenario.update(1, error=None)
    _, one = interval(nvml)
    # Back: a fresh first sample (one from before the loss is no interval's start), values with the second.
    assert (one.up, one.gpm_supported, one.gpm) == (True, True, None)
    _, one = interval(nvml)
    assert dict(one.gpm or ()) == expected(1)
    assert live(scenario) == 4
    nvml.close()
    state = scenario.state()
    assert (state["gpm_live_samples"], state["gpm_bad_samples"]) == (0, 0)
    assert state["gpm_allocated"] - allocated == state["gpm_freed"] - freed == 6


def test_a_gpm_error_of_another_kind_leaves_that_poll_out_and_the_gpu_up(scenario: Scenario, nvml: Nvml) -> None:
    nvml.read_all()
    interval(nvml)
    scenario.update(0, fail={"gpm_metrics": UNKNOWN})
    with capture_logs() as logs:
        zero, _ = interval(nvml)
        again, _ = interval(nvml)
    assert (zero.up, zero.gpm_supported, zero.gpm, again.gpm) == (True, True, None, None)
    assert zero.memory_used_bytes is not None
    assert len([e for e in logs if e["event"] == "NVML GPM read failed"]) == 1, "logged when it starts"
    scenario.update(0, fail=None)
    interval(nvml)
    zero, _ = interval(nvml)
    assert dict(zero.gpm or ()) == expected(0)
    assert count(scenario, "gpm_bad_samples") == 0


def test_each_mig_gpu_instance_has_its_own_samples_and_values(scenario: Scenario, nvml: Nvml) -> None:
    small = mig_device(1, 0, "1g.18gb", 9, gpm=gpm(5, sm_active=21.5))
    large = mig_device(1, 1, "3g.71gb", 2, gpm=gpm(6, sm_active=70.5))
    bare = mig_device(1, 2, "1g.18gb", 11)  # NVML does not sample this instance: NOT_SUPPORTED
    scenario.update(1, mig={"current": 1, "devices": [small, large, bare]})
    nvml.read_all()
    _, one = interval(nvml)
    assert one.mig_devices is not None
    by_instance = {m.gpu_instance: m.gpm for m in one.mig_devices}
    assert dict(by_instance[9] or ()) == expected(5, sm_active=21.5)
    assert dict(by_instance[2] or ()) == expected(6, sm_active=70.5)
    assert by_instance[11] is None
    assert dict(one.gpm or ()) == expected(1), "the whole GPU's values beside its instances'"
    assert live(scenario) == 2 + 2 + 2 + 2  # GPU 0, GPU 1, instances 9 and 2
    # An instance destroyed: its samples are freed.
    scenario.update(1, mig={"current": 1, "devices": [small, bare]})
    _, one = interval(nvml)
    assert [m.gpu_instance for m in one.mig_devices or ()] == [9, 11]
    assert live(scenario) == 6
    assert count(scenario, "gpm_short_intervals") == 0
