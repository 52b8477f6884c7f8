"""The real daemon on a replay file with every allocator shape: exact values, golden exposition, promtool, and its
own process_* families."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, ROOT, Daemon, Samples, StartDaemon, sample
from tests.e2e.test_golden import check_golden

GiB = 1 << 30
MiB = 1 << 20
GOLDEN = ROOT / "tests" / "golden" / "replay.prom"


def _gpu(samples: Samples, name: str, device: int, platform: str = "gpu") -> float | None:
    return sample(samples, name, device=str(device), platform=platform)


@pytest.fixture(scope="module")
def replay_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """One daemon on shapes.json that polls once (the interval is an hour), for the tests that only read it. The
    catalog's CPU device (cpu:5, the allocator that reports nothing) beside its GPUs is read as asked for: by
    default the host's CPU backend is left out beside accelerators (tests/unit/sources/test_selection.py)."""
    args = ["--replay", str(FIXTURES / "shapes.json"), "--poll.interval", "1h", "--devices.include-cpu"]
    d = Daemon(tmp_path_factory.mktemp("replay"), args)
    try:
        d.wait_ready()
        yield d
    finally:
        d.stop(signal.SIGKILL)


def test_every_allocator_shape_is_exported_exactly(replay_daemon: Daemon) -> None:
    s = replay_daemon.scrape()
    # BFC preallocated
    assert _gpu(s, "jaxmon_memory_bytes_in_use", 0) == 20 * GiB
    assert _gpu(s, "jaxmon_memory_peak_bytes_in_use", 0) == 25 * GiB
    assert _gpu(s, "jaxmon_memory_limit_bytes", 0) == 60 * GiB
    assert _gpu(s, "jaxmon_memory_pool_bytes", 0) == 60 * GiB
    assert _gpu(s, "jaxmon_memory_free_bytes", 0) == 40 * GiB
    assert _gpu(s, "jaxmon_memory_largest_free_block_bytes", 0) == 30 * GiB
    assert _gpu(s, "jaxmon_memory_fragmentation_ratio", 0) == 0.25
    assert _gpu(s, "jaxmon_memory_largest_allocatable_bytes", 0) == 30 * GiB
    assert _gpu(s, "jaxmon_memory_largest_alloc_bytes", 0) == 4 * GiB
    assert _gpu(s, "jaxmon_memory_allocations_total", 0) == 1500
    assert _gpu(s, "jaxmon_memory_stats_supported", 0) == 1
    # BFC growing: 1 - 256 MiB / (2 GiB - 1.5 GiB)
    assert _gpu(s, "jaxmon_memory_fragmentation_ratio", 1) == 0.5
    assert _gpu(s, "jaxmon_memory_largest_allocatable_bytes", 1) == 58 * GiB
    # cuda_async: no fragmentation, no headroom, no free-block series
    assert _gpu(s, "jaxmon_memory_fragmentation_ratio", 2) is None
    assert _gpu(s, "jaxmon_memory_largest_allocatable_bytes", 2) is None
    assert _gpu(s, "jaxmon_memory_largest_free_block_bytes", 2) is None
    assert _gpu(s, "jaxmon_memory_free_bytes", 2) == 50 * GiB
    # TPU
    assert _gpu(s, "jaxmon_memory_fragmentation_ratio", 3, "tpu") == 0.25
    assert _gpu(s, "jaxmon_memory_pool_bytes", 3, "tpu") is None
    # an idle TPU: nothing reserved, the reservable limit is the limit; GPUs (BFC: bytes_reserved 0) export none
    assert _gpu(s, "jaxmon_memory_reserved_bytes", 3, "tpu") == 0
    assert _gpu(s, "jaxmon_memory_reservable_limit_bytes", 3, "tpu") == 16 * GiB
    reservations = {f"jaxmon_memory_{n}" for n in ("reserved_bytes", "peak_reserved_bytes", "reservable_limit_bytes")}
    assert {n for n, labels in s if dict(labels).get("platform") == "gpu"}.isdisjoint(reservations)
    info = sample(
        s,
        "jaxmon_device_info",
        device="3",
        platform="tpu",
        device_kind="TPU v5 lite",
        process_index="0",
        coords="1,0,0",
        core_on_chip="0",
        source="replay",
    )
    assert info == 1
    # -1 fields: absent, never 0 and never NaN
    for name in ("limit_bytes", "pool_bytes", "free_bytes", "fragmentation_ratio", "largest_alloc_bytes"):
        assert _gpu(s, f"jaxmon_memory_{name}", 4) is None, name
    assert _gpu(s, "jaxmon_memory_bytes_in_use", 4) == 1 * GiB
    # None: unsupported, no numbers
    assert _gpu(s, "jaxmon_memory_stats_supported", 5, "cpu") == 0
    assert _gpu(s, "jaxmon_memory_bytes_in_use", 5, "cpu") is None
    # raising device: failed, counted, no numbers; the others above still report
    assert _gpu(s, "jaxmon_memory_read_success", 6) == 0
    assert _gpu(s, "jaxmon_memory_read_errors_total", 6) == 1  # one poll so far
    assert _gpu(s, "jaxmon_memory_bytes_in_use", 6) is None
    assert _gpu(s, "jaxmon_memory_read_success", 0) == 1
    assert sample(s, "jaxmon_collector_success", collector="memory") == 0  # one device could not be read
    # full pool
    assert _gpu(s, "jaxmon_memory_free_bytes", 7) == 0
    assert _gpu(s, "jaxmon_memory_fragmentation_ratio", 7) == 0
    assert _gpu(s, "jaxmon_memory_largest_allocatable_bytes", 7) == 0
    # no NaN anywhere
    assert all(v == v for v in s.values())
    # replayed devices run no probe
    assert not any(name.startswith("jaxmon_probe_") or name == "jaxmon_device_up" for name, _ in s)


def test_a_tpu_host_exports_its_reservations_and_not_its_cpu(start_daemon: StartDaemon) -> None:
    """tests/fixtures/tpu_reserved.json: real v5e dicts, the published large reservation, a full chip and a
    fragmented one, beside the host's CPU device, as JAX on a TPU host starts them."""
    s = start_daemon("--replay", str(FIXTURES / "tpu_reserved.json"), "--poll.interval", "1h").scrape()
    tpu = {name: {d: _gpu(s, f"jaxmon_memory_{name}", d, "tpu") for d in range(5)} for name in MEMORY}
    # The real v5e chip after steps of a program with 335,802,368 B of temporaries (XLA reserved 335,675,392 B).
    assert tpu["reserved_bytes"][0] == tpu["peak_reserved_bytes"][0] == 335_675_392
    assert tpu["reservable_limit_bytes"][0] == 16_673_775_104
    assert tpu["free_bytes"][0] == 16_909_336_064 - 209_443_328 - 335_675_392
    # The published run: 27.25 GiB reserved of 31.25 GiB, 1.35 GiB free in one block: not 28.6 GiB, not 0.95.
    assert tpu["free_bytes"][2] == 1379 * MiB and tpu["fragmentation_ratio"][2] == 0
    # Full (0.5 GB free in one block) is not fragmented; 1.5 GB free with a 0.3 GB block is.
    assert (tpu["free_bytes"][3], tpu["fragmentation_ratio"][3]) == (500_000_000, 0)
    assert tpu["free_bytes"][4] == 1_500_000_000 and tpu["fragmentation_ratio"][4] == pytest.approx(0.8)
    # The host's CPU backend is up, and its device is not read.
    assert sample(s, "jaxmon_backend_up", backend="cpu") == 1
    assert not [n for n, labels in s if dict(labels).get("platform") == "cpu"]


MEMORY = ("reserved_bytes", "peak_reserved_bytes", "reservable_limit_bytes", "free_bytes", "fragmentation_ratio")


def test_a_replayed_list_advances_one_entry_per_poll(start_daemon: StartDaemon) -> None:
    d = start_daemon("--replay", str(FIXTURES / "shapes.json"), "--poll.interval", "0.3s")
    seen: set[float] = set()

    def cycled(s: Samples) -> bool:
        value = _gpu(s, "jaxmon_memory_bytes_in_use", 8)
        if value is not None:
            seen.add(value)
        return seen == {1000.0, 2000.0, 3000.0}

    d.wait_for(cycled, timeout=30, what="all three replayed entries")
    errors_before = _gpu(d.scrape(), "jaxmon_memory_read_errors_total", 6) or 0
    after = d.wait_for(
        lambda s: (_gpu(s, "jaxmon_memory_read_errors_total", 6) or 0) > errors_before,
        timeout=10,
        what="more polls",
    )
    assert _gpu(after, "jaxmon_memory_free_bytes", 8) in {9000.0, 8000.0, 7000.0}


def test_exposition_matches_the_golden_file_and_passes_promtool(replay_daemon: Daemon) -> None:
    check_golden(replay_daemon.get("/metrics").text, "replay.prom")


def test_the_process_families_are_served(replay_daemon: Daemon) -> None:
    """process_* of the daemon itself, read per scrape: RSS and open fds match /proc."""
    d = replay_daemon
    samples = d.scrape()
    rss = sample(samples, "process_resident_memory_bytes")
    assert rss is not None
    status = Path(f"/proc/{d.proc.pid}/status").read_text()
    vm_rss = next(int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmRSS:"))
    assert abs(rss - vm_rss) < 64 * 2**20  # the same process, read moments apart
    assert sample(samples, "process_open_fds") is not None
    assert sample(samples, "process_start_time_seconds") is not None
    assert any(name == "python_info" for name, _ in samples)
