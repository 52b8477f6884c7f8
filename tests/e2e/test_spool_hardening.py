"""The spool reader against hostile and overwhelming directories: every file isolated, every cost bounded.

Each test runs the real daemon as a child process on a spool directory the test fills itself, and checks the
exported numbers against the files it wrote. read_document and the reader in-process are
tests/unit/sources/test_spool.py.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import requests

from tests.conftest import Samples, StartDaemon, parse_samples, sample, sidecar_args
from tests.spool_files import GOOD, doc, write

# The fixture's device 0, as the workload reported it.
STATS = GOOD["devices"][0]["memory_stats"]


def workloads(s: Samples) -> set[str]:
    return {dict(k[1])["workload"] for k in s if k[0] == "jaxmon_workload_info"}


def rejected(s: Samples) -> dict[str, float]:
    return {dict(k[1])["reason"]: v for k, v in s.items() if k[0] == "jaxmon_spool_rejected_files_total"}


def test_a_json_bomb_non_finite_and_out_of_range_numbers_are_each_one_rejected_file(
    tmp_path: Path, start_daemon: StartDaemon
) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    good = doc("good")
    write(spool / "good.h.1.json", good)
    write(spool / "bomb.h.2.json", "[" * 100_000 + "]" * 100_000)  # 200 KB, 100,000 levels deep
    infinity = json.dumps(doc("inf")).replace('"bytes_in_use": 1610612736', '"bytes_in_use": Infinity')
    assert "Infinity" in infinity
    write(spool / "inf.h.3.json", infinity)
    huge = doc("huge")
    huge["devices"] = [{**GOOD["devices"][0], "memory_stats": {**STATS, "bytes_limit": 10**400}}]
    write(spool / "huge.h.4.json", huge)
    write(spool / "overflow.h.5.json", json.dumps(doc("overflow")).replace('"interval": 5.0', '"interval": 1e400'))
    write(spool / "future.h.6.json", doc("future", time=1e12))  # year 33658: a broken clock
    write(spool / "nan_time.h.7.json", json.dumps(doc("t", time=12345.5)).replace('"time": 12345.5', '"time": NaN'))
    d = start_daemon(
        *sidecar_args(spool),
        "--health.max-staleness",
        "2s",
    )
    s = d.wait_for(lambda s: workloads(s) == {"good"}, timeout=30, what="the good workload")
    labels = {"device": "0", "platform": "gpu", "workload": "good"}
    assert sample(s, "jaxmon_memory_bytes_in_use", **labels) == STATS["bytes_in_use"]
    assert sample(s, "jaxmon_memory_free_bytes", **labels) == STATS["bytes_limit"] - STATS["bytes_in_use"]
    expected = {"bad_json": 3, "bad_schema": 3, "error": 0}
    assert {r: rejected(s).get(r) for r in expected} == expected
    first_memory = sample(s, "jaxmon_collector_last_success_timestamp_seconds", collector="memory")
    assert first_memory is not None
    # The polls go on: both collectors succeed again, /healthz stays 200, nothing is counted twice.
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        assert d.get("/healthz").status_code == 200, d.get("/healthz").text
        time.sleep(0.2)
    s = d.scrape()
    assert (sample(s, "jaxmon_collector_last_success_timestamp_seconds", collector="memory") or 0) > first_memory + 1
    assert sample(s, "jaxmon_collector_success", collector="spool") == 1
    assert {r: rejected(s).get(r) for r in expected} == expected
    log = d.log()
    assert log.count("spool file rejected") == 6
    assert "nested too deeply" in log and "non-finite number Infinity" in log and "non-finite number NaN" in log


def test_liveness_is_the_files_mtime_on_the_readers_clock_not_the_documents_time(
    tmp_path: Path, start_daemon: StartDaemon
) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    d = start_daemon(
        *sidecar_args(spool),
        "--collector.spool.ttl",
        "2s",
    )
    now = time.time()
    write(spool / "future.h.1.json", doc("future", time=now + 10 * 365 * 86400))  # a clock ten years ahead
    write(spool / "old.h.2.json", doc("old", time=1000.0))  # a clock in 1970, but the file is fresh
    write(spool / "touched.h.3.json", doc("touched"), mtime=now + 86400)  # an mtime a day ahead
    d.wait_for(lambda s: workloads(s) == {"future", "old", "touched"}, timeout=10, what="all three")
    # The exported report time is the file's mtime, which the test sets.
    stamp = round(time.time(), 3)
    os.utime(spool / "old.h.2.json", (stamp, stamp))
    d.wait_for(
        lambda s: (
            sample(s, "jaxmon_workload_last_report_timestamp_seconds", workload="old", process_index="0") == stamp
        ),
        timeout=10,
        what="the old-time report at its file's mtime",
    )

    # Only "old" keeps being written: the other two stop changing and disappear after the TTL, although one
    # claims to be from the future and the other's mtime is.
    def keep_old_fresh(s: Samples) -> bool:
        t = time.time()
        os.utime(spool / "old.h.2.json", (t, t))
        return workloads(s) == {"old"}

    started = time.monotonic()
    d.wait_for(keep_old_fresh, timeout=15, what="future and touched gone, old still live")
    assert time.monotonic() - started > 1.0  # not at once: they were live until the TTL passed
    # An unchanged file read from the cache ages too.
    d.wait_for(lambda s: not workloads(s), timeout=15, what="old gone once it stops changing")


def test_a_directory_of_twenty_thousand_files_is_capped_and_counted(tmp_path: Path, start_daemon: StartDaemon) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    body = json.dumps(doc("placeholder"))
    for i in range(20_000):
        (spool / f"w{i:05d}.h.{i}.json").write_text(body.replace('"placeholder"', f'"w{i:05d}"'))
    d = start_daemon(
        *sidecar_args(spool, poll="0.3s"),
        "--collector.spool.max-workloads",
        "40",
        "--collector.spool.max-reads-per-poll",
        "25",
    )
    # 25 reads per poll: the first poll shows 25 workloads, the second the first 40 in name order.
    s = d.wait_for(lambda s: len(workloads(s)) == 40, timeout=30, what="40 workloads")
    assert workloads(s) == {f"w{i:05d}" for i in range(40)}
    # Only the first poll ran out of reads (25 read, the other 19,975 left for later); the second needed 15.
    assert sample(s, "jaxmon_spool_overflow_files_total", reason="read_budget") == 20_000 - 25
    over = sample(s, "jaxmon_spool_overflow_files_total", reason="max_workloads")
    # Every later poll leaves exactly the files past the first 40 unread.
    assert over is not None and over > 0 and over % (20_000 - 40) == 0, over
    r = d.get("/metrics")
    assert r.status_code == 200
    assert len(r.content) < 300_000, len(r.content)  # 40 workloads, not 20,000
    assert sample(parse_samples(r.text), "jaxmon_spool_stale_files") == 0
    assert d.get("/healthz").status_code == 200


# Enough that the first scan outlasts the 0.5 s staleness limit on a quiet machine too (40 took 0.48 s in CI).
HEAVY_FILES = 160


def test_a_slow_spool_scan_does_not_make_the_sidecar_unhealthy(tmp_path: Path, start_daemon: StartDaemon) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    # Files that are expensive to read and then rejected: 1024 devices each (~0.5 MB), then a bad compile counter.
    heavy = doc("heavy", devices=GOOD["devices"] * 1024, compile={"compilations": -1})
    body = json.dumps(heavy)
    for i in range(HEAVY_FILES):
        (spool / f"heavy.h.{i}.json").write_text(body)
    d = start_daemon(
        "--no-collector.probe",
        "--collector.spool.dir",
        str(spool),
        "--collector.spool.max-reads-per-poll",
        "1000",
        "--poll.interval",
        "0.1s",
        "--health.max-staleness",
        "0.5s",
        ready=False,
    )
    statuses: list[tuple[float, int]] = []  # (time, /healthz status) while the first scan had not finished
    deadline = time.monotonic() + 60
    while True:
        assert time.monotonic() < deadline, d.log()
        try:
            status = d.get("/healthz", timeout=5).status_code
        except requests.ConnectionError:
            time.sleep(0.1)
            continue
        spool_done = (
            sample(d.scrape(), "jaxmon_spool_rejected_files_total", reason="bad_schema") == HEAVY_FILES
        )  # the first scan finished
        if spool_done:
            break
        statuses.append((time.monotonic(), status))
        time.sleep(0.05)
    healthy = [t for t, status in statuses if status == 200]
    assert healthy, statuses  # healthy while the slow scan ran
    first = healthy[0]
    assert all(status == 200 for t, status in statuses if t >= first), statuses
    # Healthy for longer than the staleness limit while the first scan was still running.
    assert statuses[-1][0] - first > 0.5, f"the scan ended {statuses[-1][0] - first:.2f}s after the first 200"
    assert d.get("/healthz").status_code == 200


def test_the_sidecar_removes_old_stale_publisher_files_and_counts_the_rest(
    tmp_path: Path, start_daemon: StartDaemon
) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    now = time.time()
    write(spool / "gone.h.1.json", doc("gone"), mtime=now - 1000)  # past --collector.spool.remove-after: removed
    write(spool / ".gone.h.2.json.abcd1234.tmp", "{", mtime=now - 1000)  # a crashed writer's: removed
    write(spool / "young.h.3.json", doc("young"), mtime=now - 20)  # stale, not old enough: counted
    write(spool / ".young.h.4.json.abcd1234.tmp", "{", mtime=now - 20)  # counted
    write(spool / "notes.json", doc("notes"), mtime=now - 1000)  # not a publisher's name: counted, never removed
    write(spool / ".hidden", "x", mtime=now - 1000)  # not ours at all: left alone, not counted
    write(spool / "live.h.5.json", doc("live"))
    d = start_daemon(
        *sidecar_args(spool),
        "--collector.spool.ttl",
        "10s",
        "--collector.spool.remove-after",
        "120s",
    )
    s = d.wait_for(
        lambda s: sample(s, "jaxmon_spool_removed_files_total", kind="tmp") == 1, timeout=30, what="removals"
    )
    assert sample(s, "jaxmon_spool_removed_files_total", kind="json") == 1
    assert sample(s, "jaxmon_spool_stale_files") == 3
    assert workloads(s) == {"live"}
    assert sorted(p.name for p in spool.iterdir()) == sorted(
        [".young.h.4.json.abcd1234.tmp", "young.h.3.json", "notes.json", ".hidden", "live.h.5.json"]
    )


def test_a_spool_directory_that_appears_later_is_read_then_and_the_sidecar_stays_healthy(
    tmp_path: Path, start_daemon: StartDaemon
) -> None:
    spool = tmp_path / "not-yet"
    d = start_daemon("--no-collector.probe", "--collector.spool.dir", str(spool), "--poll.interval", "0.2s")
    s = d.wait_for(
        lambda s: sample(s, "jaxmon_collector_success", collector="spool") == 0, timeout=10, what="a failed scan"
    )
    assert sample(s, "jaxmon_spool_stale_files") is None  # unknown while the directory cannot be listed: absent
    assert d.get("/healthz").status_code == 200
    spool.mkdir()
    write(spool / "late.h.1.json", doc("late"))
    s = d.wait_for(lambda s: workloads(s) == {"late"}, timeout=10, what="the workload once the directory exists")
    assert sample(s, "jaxmon_collector_success", collector="spool") == 1
    assert sample(s, "jaxmon_spool_stale_files") == 0
    assert d.log().count("spool directory unreadable") == 1  # once, however many polls failed
