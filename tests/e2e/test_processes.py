"""jaxmon inside real workload processes: exits, forks, and a publisher whose writes keep failing."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from jaxmon.sources.spool import safe_name
from tests.conftest import ROOT, StartDaemon, free_port, sample, sidecar_args

ENV = {**os.environ, "JAX_NUM_CPU_DEVICES": "8", "PYTHONUNBUFFERED": "1"}


def run_script(code: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=ENV,
    )


# Exits while the publisher thread is at different points: importing JAX, starting its backend, writing.
EXIT_SCRIPT = """
    import sys, time
    import jaxmon
    spool, run, delay, status = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
    p = jaxmon.publish(spool, workload=run, interval=0.05)
    if delay < 0:  # wait for the first file, then exit: the file must vanish with the process
        deadline = time.monotonic() + 60
        while not p.path.exists():
            assert time.monotonic() < deadline, "no spool file written"
            time.sleep(0.01)
    else:
        time.sleep(delay)
    if status:
        sys.exit(status)
"""


def test_two_dozen_short_publishing_scripts_each_exit_with_their_own_status(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    delays = [0.0, 0.2, 0.5, 0.8, 1.3, -1.0]
    # Every delay twice with a normal exit (0) and twice with sys.exit(3).
    runs = [(f"run{i}", delays[i % len(delays)], 3 if (i // len(delays)) % 2 else 0) for i in range(24)]

    def one(run: tuple[str, float, int]) -> tuple[str, int, int, str]:
        name, delay, status = run
        result = run_script(EXIT_SCRIPT, str(spool), name, str(delay), str(status))
        return name, status, result.returncode, result.stderr

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(one, runs))
    wrong = [(name, want, got, err[-2000:]) for name, want, got, err in results if got != want]
    assert not wrong, wrong
    for _, _, _, err in results:
        assert "terminate called" not in err and "FATAL" not in err, err
    # Every run exited cleanly: none left its file (or a temporary file) behind.
    assert sorted(p.name for p in spool.iterdir()) == []


EMBEDDED_EXIT_SCRIPT = """
    import sys, time
    import jaxmon
    exporter = jaxmon.start(0, poll={"interval": 0.05}, collector={"probe": {"interval": 0.2}})
    time.sleep(float(sys.argv[1]))
    sys.exit(int(sys.argv[2]))
"""


def test_scripts_running_the_embedded_exporter_exit_with_their_own_status(tmp_path: Path) -> None:
    # The exit hook stops the exporter and joins the probe's threads before finalization (1 run in 16 aborted
    # with exit 134 before it, with the probe compiling or running at exit).
    runs = [(delay, status) for delay in (0.0, 0.5, 1.0, 2.0) for status in (0, 3)]

    def one(run: tuple[float, int]) -> tuple[int, int, str]:
        result = run_script(EMBEDDED_EXIT_SCRIPT, str(run[0]), str(run[1]))
        return run[1], result.returncode, result.stderr

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(one, runs))
    wrong = [(want, got, err[-2000:]) for want, got, err in results if got != want]
    assert not wrong, wrong
    for _, _, err in results:
        assert "terminate called" not in err and "FATAL" not in err and "still inside JAX" not in err, err


def test_a_clean_exit_removes_the_workload_at_the_next_poll_not_after_the_ttl(
    tmp_path: Path, start_daemon: StartDaemon
) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    d = start_daemon(
        *sidecar_args(spool),
        "--collector.spool.ttl",
        "60s",
    )
    code = """
        import sys, time
        import jaxmon
        p = jaxmon.publish(sys.argv[1], workload="leaving", interval=0.2)
        while not p.path.exists():
            time.sleep(0.01)
        print("published", flush=True)
        sys.stdin.readline()  # exit normally, without stop(), when the test closes stdin
    """
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), str(spool)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=ENV,
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == "published"
        d.wait_for(
            lambda s: (
                sample(
                    s,
                    "jaxmon_workload_info",
                    workload="leaving",
                    process_index="0",
                    host=os.uname().nodename,
                    pid=str(child.pid),
                    jax_version=__import__("jax").__version__,
                )
                == 1
            ),
            timeout=30,
            what="the workload",
        )
        child.stdin.close()
        assert child.wait(60) == 0
        started = time.monotonic()
        d.wait_for(lambda s: not any(k[0] == "jaxmon_workload_info" for k in s), timeout=10, what="the workload gone")
        assert time.monotonic() - started < 10  # far inside the 60 s TTL
        assert list(spool.iterdir()) == []
    finally:
        child.kill()
        child.wait()


def test_a_forked_child_lets_go_of_the_exporters_port(tmp_path: Path) -> None:
    port = free_port()
    code = """
        import json, os, socket, sys, time
        import jaxmon
        port = int(sys.argv[1])
        exporter = jaxmon.start(port, collector={"probe": False}, poll={"interval": 0.2})
        assert exporter.serving
        up_r, up_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: a data loader worker that lives on after the parent stops its exporter
            child = jaxmon.start(0, collector={"memory": False, "probe": False, "compile": False})
            jaxmon.step(1)  # JAX cannot run here: a step neither compiles nor dispatches anything (that would hang)
            print(json.dumps({"child_new_exporter": child is not exporter, "child_port": child.port}), flush=True)
            os.write(up_w, b"u")
            time.sleep(30)
            os._exit(0)
        assert os.read(up_r, 1) == b"u"  # the child is up (and printed)
        exporter.stop()
        probe = socket.socket()
        probe.settimeout(2)
        try:
            probe.connect(("127.0.0.1", port))
            refused = False
        except ConnectionRefusedError:
            refused = True
        probe.close()
        again = socket.socket()
        try:
            again.bind(("127.0.0.1", port))
            again.listen()
            rebound = True
        except OSError:
            rebound = False
        again.close()
        alive = os.waitpid(pid, os.WNOHANG) == (0, 0)
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        print(json.dumps({"refused": refused, "rebound": rebound, "child_alive": alive}), flush=True)
    """
    result = run_script(code, str(port), timeout=120)
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    facts = {k: v for line in lines for k, v in line.items()}
    assert facts["child_alive"] is True  # the child still ran while the parent's port was checked
    assert facts["refused"] is True, result.stderr  # a scrape is refused, not queued on the child's copy
    assert facts["rebound"] is True  # the port is free again
    assert facts["child_new_exporter"] is True and facts["child_port"] != port
    assert "forked child is not monitored" in result.stderr
    assert "training telemetry is off in this process: it was forked after JAX started" in result.stderr


def test_a_publisher_whose_writes_keep_failing_logs_it_once(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    code = """
        import os, socket, sys, time
        import jaxmon
        from jaxmon.sources.spool import safe_name
        spool = sys.argv[1]
        os.makedirs(spool)
        # A directory where the file goes: every os.replace fails, naming a new random temporary file.
        os.mkdir(os.path.join(spool, f"w.{safe_name(socket.gethostname())}.{os.getpid()}.json"))
        p = jaxmon.publish(spool, workload="w", interval=0.05)
        deadline = time.monotonic() + 60
        while p.failures < 20:
            assert time.monotonic() < deadline, "no failures"
            time.sleep(0.01)
        print(p.failures, flush=True)
    """
    result = run_script(code, str(spool))
    assert result.returncode == 0, result.stderr
    assert int(result.stdout.strip()) >= 20
    assert result.stderr.count("spool write failed") == 1, result.stderr
    assert "IsADirectoryError" in result.stderr
    assert [p.name for p in spool.iterdir()] == [f"w.{safe_name(socket.gethostname())}.{_pid_of(spool)}.json"]


def _pid_of(spool: Path) -> str:
    return next(iter(spool.iterdir())).name.rsplit(".", 2)[-2]


def test_a_publisher_removes_its_workloads_old_files_at_start_and_nothing_else(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    host = safe_name(socket.gethostname())
    old = time.time() - 1000
    names = {
        f"mine.{host}.999999.json": old,  # a crashed run of this workload: removed
        f".mine.{host}.999999.json.abcd1234.tmp": old,  # its orphaned temporary file: removed
        f"mine.{host}.999998.json": time.time(),  # recent: maybe live in another PID namespace, kept
        f"other.{host}.999997.json": old,  # another workload's: kept
        "mine.otherhost.999996.json": old,  # another host's: kept
    }
    for name, mtime in names.items():
        (spool / name).write_text("{}")
        os.utime(spool / name, (mtime, mtime))
    code = """
        import sys, time
        import jaxmon
        p = jaxmon.publish(sys.argv[1], workload="mine", interval=0.05)
        while p.writes < 1:
            time.sleep(0.01)
        print(p.removed_stale, p.path.name, flush=True)
        p.stop(remove=False)
    """
    result = run_script(code, str(spool))
    assert result.returncode == 0, result.stderr
    removed, own = result.stdout.split()
    assert removed == "2"
    assert sorted(p.name for p in spool.iterdir()) == sorted(
        [f"mine.{host}.999998.json", f"other.{host}.999997.json", "mine.otherhost.999996.json", own]
    )


def test_a_spool_dir_that_is_a_regular_file_is_a_settings_error(tmp_path: Path) -> None:
    blocker = tmp_path / "spool"
    blocker.write_text("not a directory")
    result = subprocess.run(
        [sys.executable, "-m", "jaxmon", "serve", "--collector.spool.dir", str(blocker)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=ENV,
    )
    assert result.returncode == 2, result.stderr
    assert "spool.dir" in result.stderr and "is not a directory" in result.stderr
