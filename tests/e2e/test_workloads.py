"""The workload bridge with real child processes training on JAX CPU devices: embedded and publisher + sidecar."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from jaxmon.sources.spool_document import read_document
from tests.conftest import ROOT, Samples, StartDaemon, sample, sidecar_args
from tests.helpers import FIXTURES, Child, wait_for_fresh_samples, wait_for_samples, wait_until

# What the toy loop keeps on the default device (cpu:0): x (256 x 64), y (256 x 1), w (64 x 1), b (1), float32.
TRAINING_STATE_BYTES = 4 * (256 * 64 + 256 + 64 + 1)


def test_embedded_exporter_reports_live_arrays_and_compilations(children: list[Child], tmp_path: Path) -> None:
    child = Child(tmp_path, "embedded", "--workload", "toy", env={"JAXMON_COLLECTOR__PROBE": "false"})
    children.append(child)
    url = child.hello["url"]
    # Arrays the test creates: 1 MiB on device 3, 64 KiB on device 0, and 32 KiB sharded over all 8 devices
    # (4 KiB per device: arr.nbytes is the global size and must not be counted on every device).
    child.send(f"alloc 3 {1 << 20}")
    child.send(f"alloc 0 {64 << 10}")
    child.send(f"shard {32 << 10}")
    expected = {str(d): 4096 for d in range(8)}
    expected["3"] += 1 << 20
    expected["0"] += (64 << 10) + TRAINING_STATE_BYTES

    def live_matches(s: Samples) -> bool:
        return all(
            sample(s, "jaxmon_memory_live_array_bytes", device=d, platform="cpu", workload="toy") == v
            for d, v in expected.items()
        )

    s = wait_for_samples(url, live_matches, "live array bytes equal to the arrays created")
    assert sample(s, "jaxmon_memory_stats_supported", device="0", platform="cpu", workload="toy") == 0

    labels = {"workload": "toy", "process_index": "0"}
    before = wait_for_samples(
        url, lambda s: sample(s, "jaxmon_jit_compilations_total", **labels) is not None, "compile counter"
    )
    n_before = sample(before, "jaxmon_jit_compilations_total", **labels)
    secs_before = sample(before, "jaxmon_jit_compile_seconds_total", **labels)
    assert n_before is not None and secs_before is not None
    assert child.send("compile 5") == {"compiled": 5}
    after = wait_for_samples(
        url, lambda s: sample(s, "jaxmon_jit_compilations_total", **labels) == n_before + 5, "five more compilations"
    )
    assert (sample(after, "jaxmon_jit_compile_seconds_total", **labels) or 0) > secs_before
    # No phantom compilations appear later: updates that read the counters after the compiles still say 5 more.
    assert sample(wait_for_fresh_samples(url, "compile"), "jaxmon_jit_compilations_total", **labels) == n_before + 5

    median = child.send("train 20")["median"]
    assert median > 0
    assert child.send("exit") == {"stopped": True}
    assert child.proc.wait(30) == 0


def test_persistent_compilation_cache_hits_and_misses_are_counted(children: list[Child], tmp_path: Path) -> None:
    env = {
        "JAXMON_COLLECTOR__PROBE": "false",
        "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "jax-cache"),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
    }
    child = Child(tmp_path, "embedded", "--workload", "cached", env=env)
    children.append(child)
    url = child.hello["url"]
    child.send("alloc 0 4096")
    labels = {"workload": "cached", "process_index": "0"}

    def counters(s: Samples) -> tuple[float | None, float | None]:
        return (
            sample(s, "jaxmon_compilation_cache_misses_total", **labels),
            sample(s, "jaxmon_compilation_cache_hits_total", **labels),
        )

    # Counters read after the compilations done so far (start-up, alloc) have finished.
    misses0, hits0 = counters(wait_for_fresh_samples(url, "compile", "after the alloc"))
    assert misses0 is not None and hits0 == 0
    child.send("compile 4")  # four new programs: four entries written
    wait_for_samples(url, lambda s: counters(s) == (misses0 + 4, 0), "four misses")
    assert child.send("recompile") == {"recompiled": 4}  # same programs after clearing memory caches: four hits
    wait_for_samples(url, lambda s: counters(s) == (misses0 + 4, 4), "four hits")


def test_embedded_start_twice_returns_the_running_exporter_and_says_so(tmp_path: Path) -> None:
    """The second start() returns the first exporter; asking for another port is not silent. Serving is logged
    with the URL (the application's logging shows jaxmon's lines: jaxmon never prints on its own)."""
    code = (
        "import logging, os; os.environ['JAX_NUM_CPU_DEVICES']='8'\n"
        "logging.basicConfig(level=logging.INFO, format='%(levelname)s %(message)s')\n"
        "import jaxmon\n"
        "a = jaxmon.start(0, collector={'probe': False})\n"
        "print('port', a.port, flush=True)\n"
        "b = jaxmon.start(10413)\n"
        "assert a is b, 'two exporters'\n"
        "with jaxmon.start() as c:\n"
        "    assert c is a\n"
        "d = jaxmon.start(0, collector={'probe': False})\n"
        "assert d is not a, 'a stopped exporter must not be handed out'\n"
        "d.stop()\n"
        "print('fine')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("fine")
    port = result.stdout.split()[1]
    serving = [line for line in result.stderr.splitlines() if "jaxmon serving on http://" in line]
    assert len(serving) == 2 and f":{port}/metrics" in serving[0], result.stderr
    (warning,) = [line for line in result.stderr.splitlines() if "already running" in line]
    assert warning.startswith("WARNING") and "asked_port=10413" in warning and f":{port}/metrics" in warning


def _workload_series(s: Samples, workload: str) -> list[tuple[str, frozenset[tuple[str, str]]]]:
    return [k for k in s if ("workload", workload) in k[1]]


def test_two_publishers_and_a_sidecar(children: list[Child], tmp_path: Path, start_daemon: StartDaemon) -> None:
    spool = tmp_path / "spool"
    alpha = Child(tmp_path, "publish", "--spool", str(spool), "--workload", "alpha", "--alloc", "8192")
    beta = Child(tmp_path, "publish", "--spool", str(spool), "--workload", "beta", "--alloc", "4096")
    children += [alpha, beta]
    d = start_daemon(
        "--no-collector.probe",
        "--collector.spool.dir",
        str(spool),
        "--collector.spool.ttl",
        "2s",
        "--poll.interval",
        "0.3s",
    )

    def both(s: Samples) -> bool:
        return all(
            sample(
                s,
                "jaxmon_workload_info",
                workload=w,
                process_index="0",
                host=os.uname().nodename,
                pid=str(c.hello["pid"]),
                jax_version=__import__("jax").__version__,
            )
            == 1
            for w, c in (("alpha", alpha), ("beta", beta))
        )

    s = d.wait_for(both, timeout=60, what="both workloads")
    assert sample(s, "jaxmon_memory_live_array_bytes", device="0", platform="cpu", workload="alpha") == (
        8192 + TRAINING_STATE_BYTES
    )
    assert sample(s, "jaxmon_memory_live_array_bytes", device="0", platform="cpu", workload="beta") == (
        4096 + TRAINING_STATE_BYTES
    )
    assert sample(s, "jaxmon_memory_live_array_bytes", device="1", platform="cpu", workload="beta") == 0
    assert sample(s, "jaxmon_memory_stats_supported", device="5", platform="cpu", workload="alpha") == 0
    assert (
        sample(
            s,
            "jaxmon_device_info",
            device="5",
            platform="cpu",
            workload="alpha",
            device_kind="cpu",
            process_index="0",
            coords="",
            core_on_chip="",
            source="spool",
        )
        == 1
    )
    assert sample(s, "jaxmon_jit_compilations_total", workload="alpha", process_index="0") is not None
    last = sample(s, "jaxmon_workload_last_report_timestamp_seconds", workload="alpha", process_index="0")
    assert last is not None and abs(time.time() - last) < 10
    assert sample(s, "jaxmon_collector_success", collector="spool") == 1

    # SIGKILL: no clean-up runs; the workload disappears once its last report is older than the TTL.
    alpha.proc.send_signal(signal.SIGKILL)
    s = d.wait_for(lambda s: not _workload_series(s, "alpha"), timeout=20, what="alpha gone after the TTL")
    assert _workload_series(s, "beta")

    # A restarted beta replaces its predecessor's series at once (newest start wins), without duplicates.
    beta.proc.send_signal(signal.SIGKILL)
    beta2 = Child(tmp_path, "publish", "--spool", str(spool), "--workload", "beta", "--alloc", "12288")
    children.append(beta2)
    s = d.wait_for(
        lambda s: (
            sample(s, "jaxmon_memory_live_array_bytes", device="0", platform="cpu", workload="beta")
            == 12288 + TRAINING_STATE_BYTES
        ),
        timeout=30,
        what="restarted beta",
    )
    pids = {dict(k[1])["pid"] for k in s if k[0] == "jaxmon_workload_info" and ("workload", "beta") in k[1]}
    assert pids == {str(beta2.hello["pid"])}


def test_bad_spool_files_are_rejected_and_counted_while_good_ones_flow(
    children: list[Child], tmp_path: Path, start_daemon: StartDaemon
) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    good = json.loads((FIXTURES / "spool_document.json").read_text())
    (spool / "bad_json.json").write_text('{"schema": "jaxmon.spool/1", "devices": [')
    (spool / "old_schema.json").write_text(json.dumps({**good, "schema": "jaxmon.spool/0"}))
    (spool / "bad_schema.json").write_text(json.dumps({**good, "pid": "not a pid"}))
    (spool / "oversized.json").write_text(json.dumps({**good, "devices": good["devices"] * 200}))
    (spool / "link.json").symlink_to(spool / "old_schema.json")
    (spool / "dir.json").mkdir()
    os.mkfifo(spool / "fifo.json")
    (spool / "notes.txt").write_text("hello")
    publisher = Child(tmp_path, "publish", "--spool", str(spool), "--workload", "good", "--alloc", "4096")
    children.append(publisher)
    d = start_daemon(
        *sidecar_args(spool, poll="0.3s"),
        "--collector.spool.max-file-bytes",
        "16384",
    )
    s = d.wait_for(
        lambda s: (
            sample(s, "jaxmon_memory_live_array_bytes", device="0", platform="cpu", workload="good")
            == 4096 + TRAINING_STATE_BYTES
        ),
        timeout=60,
        what="the good workload",
    )
    expected = {
        "bad_json": 1,
        "schema_version": 1,
        "bad_schema": 1,
        "oversized": 1,
        "symlink": 1,
        "not_a_file": 2,
        "name": 1,
        "unreadable": 0,
    }
    for reason, count in expected.items():
        assert sample(s, "jaxmon_spool_rejected_files_total", reason=reason) == count, reason
    # Unchanged files are not re-counted on later polls, and the good workload keeps reporting.
    first = sample(s, "jaxmon_workload_last_report_timestamp_seconds", workload="good", process_index="0")
    s = d.wait_for(
        lambda s: (
            (sample(s, "jaxmon_workload_last_report_timestamp_seconds", workload="good", process_index="0") or 0)
            > (first or 0)
        ),
        timeout=10,
        what="a newer report",
    )
    for reason, count in expected.items():
        assert sample(s, "jaxmon_spool_rejected_files_total", reason=reason) == count, reason
    assert d.get("/healthz").status_code == 200
    assert d.log().count("spool file rejected") == 8  # logged once each


def test_a_publisher_on_an_unwritable_directory_keeps_training_and_recovers(
    children: list[Child], tmp_path: Path
) -> None:
    blocker = tmp_path / "spool"
    blocker.write_text("a file where the directory should be")
    spool = blocker / "sub"  # mkdir fails with ENOTDIR, even for root
    child = Child(tmp_path, "publish", "--spool", str(spool), "--workload", "w", "--train-forever")
    children.append(child)
    assert child.proc.stdout is not None
    steps = [child.proc.stdout.readline() for _ in range(3)]
    assert all(line.startswith("STEP") for line in steps), steps
    wait_until(lambda: "spool write failed" in child.log(), what="the failure logged", detail=child.log)
    assert child.proc.poll() is None
    blocker.unlink()  # the directory becomes possible: the publisher retries and succeeds
    wait_until(
        lambda: spool.is_dir() and any(p.suffix == ".json" for p in spool.iterdir()),
        what="a spool file written",
        detail=child.log,
    )
    # Logged right after the write that made the file appear.
    wait_until(lambda: "spool writable again" in child.log(), what="the recovery logged", detail=child.log)
    files = [p for p in spool.iterdir() if p.suffix == ".json"]
    assert read_document(files[0], 1 << 20).workload == "w"
    assert child.proc.stdout.readline().startswith("STEP")  # still training
