"""A large sampled trace is read in a child process (jaxmon.training.trace_split), so that its parse does not hold
the training process's GIL: the child is a real `python -m jaxmon.training.trace_split`, and what it reads is what
the sampler's own thread reads (the profiler is faked at its boundary, with GPU XSpace bytes: tests/xspace_fakes.py).
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import requests

from jaxmon.finalization import EXIT_WAIT
from jaxmon.training.handed import SamplerConfig
from jaxmon.training.sampler import Sampler
from jaxmon.training.trace_links import Catalog
from jaxmon.training.trace_split import Reader, Stopped, split, split_trace
from tests.helpers import ROOT, Child, parse_samples, wait_until
from tests.unit.training.test_sampler import BEFORE, NOW, US, FakeProfiler, at, got, run_block
from tests.unit.xla.test_split_fakes import GPU0, GPU1
from tests.xspace_fakes import START_UNIX_NS, Kernel, gpu_space

END_US = 100.0


@pytest.fixture
def samplers() -> Iterator[list[Sampler]]:
    made: list[Sampler] = []
    yield made
    for s in made:
        s.stop(5)


def sampler(made: list[Sampler], profiler: FakeProfiler, in_process: int) -> Sampler:
    s = Sampler(
        profiler,
        SamplerConfig(10, 2),
        # as test_sampler.py's: a start reads BEFORE
        clock=lambda: NOW if profiler.stops >= profiler.starts else BEFORE,
        wall_ns=lambda: START_UNIX_NS + round(END_US * 1000),
        in_process=in_process,
    )
    made.append(s)
    return s


def test_the_child_reads_the_split_the_sampler_reads_itself(samplers: list[Sampler]) -> None:
    completions = [(9, at(0)), (10, at(50)), (11, at(100))]
    readings = []
    for limit in (1 << 20, 0):  # 0: every trace is larger than the limit
        profiler = FakeProfiler(gpu_space({0: GPU0, 1: GPU1}))
        readings.append(run_block(sampler(samplers, profiler, limit), profiler, completions))
    here, child = readings
    assert child.results == here.results == {"taken": 1, "busy": 0, "failed": 0, "skipped": 0}
    assert len(child.devices) == 2 and child.devices == here.devices
    assert child.devices[0].profiled_seconds_total == pytest.approx(100 * US)


def test_a_trace_the_child_cannot_read_is_a_failed_sample_and_the_next_is_taken(samplers: list[Sampler]) -> None:
    profiler = FakeProfiler(b"\x0a\xff\xff")  # a plane whose length runs past the end of the bytes
    s = sampler(samplers, profiler, 0)
    assert run_block(s, profiler, [(9, at(0)), (10, at(50)), (11, at(100))]).results["failed"] == 1
    profiler.data = gpu_space({0: GPU0})
    s.handed(18)
    wait_until(lambda: profiler.starts == 2, what="the second trace started")
    s.completed([19, 20, 21], [at(0), at(50), at(100)])
    wait_until(lambda: got(s).results["taken"] == 1, what="the next sample taken")


def test_the_child_says_why_it_failed() -> None:
    with pytest.raises(RuntimeError, match="reader process failed"):
        split(b"\x0a\xff\xff", Catalog(), [(START_UNIX_NS, START_UNIX_NS + 1000)], limit=0)
    data = gpu_space({0: GPU0})
    windows = [(START_UNIX_NS, START_UNIX_NS + 50_000)]
    assert split(data, Catalog(), windows, limit=0) == split_trace(data, Catalog(), windows)


# --------------------------------------------------------------------------------------- the reader's lifetime

BIG_TRACE = ROOT / "tests" / "workloads" / "big_trace.py"
READER = b"jaxmon.training.trace_split"


def readers(parent: int) -> list[int]:
    """The trace readers (`python -m jaxmon.training.trace_split`) that process `parent` started and still holds
    (running, stopped or not yet reaped)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:  # gone meanwhile
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == parent and READER in cmdline:
            found.append(int(entry.name))
    return found


def gone(pid: int) -> bool:
    """No process `pid`, not even a zombie: it ended and was reaped."""
    return not Path(f"/proc/{pid}").exists()


@pytest.fixture
def paused() -> Iterator[list[int]]:
    """The readers a test stopped (SIGSTOP), killed after it whatever it found."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def slow_reader(parent: int, paused: list[int]) -> int:
    """The reader `parent` started, stopped with SIGSTOP: a read that does not end (a trace it takes minutes to
    parse, a machine out of CPU) until someone kills it."""
    found: list[int] = []

    def started() -> bool:
        found.extend(readers(parent))
        return bool(found)

    wait_until(started, 120, "a trace reader started", step=0.005)
    os.kill(found[0], signal.SIGSTOP)
    paused.append(found[0])
    return found[0]


@functools.cache
def big_trace() -> bytes:
    """A GPU trace of about 30 MB (its reading takes seconds: time to catch the reader at it): 40 copies of a trace
    of GPU0's kernels 1,000 times over (an XSpace's repeated planes concatenate)."""
    kernels = [
        Kernel(k.stream, k.name, k.start_us / 1000 + i / 10, k.end_us / 1000 + i / 10, k.hlo_op, k.memcpy)
        for i in range(1000)
        for k in GPU0
    ]
    return gpu_space({0: kernels}, profile_us=200) * 40


@contextlib.contextmanager
def read_only(path: Path) -> Iterator[Path]:
    """A directory nobody can write: `path` made 0555, and immutable (chattr +i) where permissions do not stop this
    user (root); where the file system takes no such flag (an overlay), a directory of /proc, where no file can be
    made."""
    path.mkdir()
    path.chmod(0o555)
    immutable = False
    try:
        directory = path
        if os.access(path, os.W_OK):
            try:
                subprocess.run(["chattr", "+i", str(path)], check=True, capture_output=True)
                immutable = True
            except (OSError, subprocess.CalledProcessError):
                directory = Path("/proc/self/fdinfo")
        with pytest.raises(OSError):
            (directory / "probe").touch()
        yield directory
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(path)], check=True, capture_output=True)
        path.chmod(0o755)


def temporary_directory(monkeypatch: pytest.MonkeyPatch, path: Path) -> None:
    """Make `path` this process's and its children's temporary directory."""
    monkeypatch.setenv("TMPDIR", str(path))
    monkeypatch.setattr(tempfile, "tempdir", str(path))


def test_a_stop_while_the_child_reads_kills_it_at_once_and_leaves_no_file(
    samplers: list[Sampler], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, paused: list[int]
) -> None:
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    temporary_directory(monkeypatch, temporary)
    profiler = FakeProfiler(big_trace())
    s = sampler(samplers, profiler, 0)
    s.handed(8)
    wait_until(lambda: profiler.starts == 1, what="the trace started")
    s.completed([9, 10, 11], [at(0), at(50), at(100)])
    reader = slow_reader(os.getpid(), paused)
    assert list(temporary.iterdir()) == []  # the trace went to the reader on its stdin
    s.stop(60)  # the exit's wait (EXIT_WAIT): a stop that waited for the read would wait all of it
    assert not s.threads[0].is_alive(), "the sampler's stop waited for the trace's reader"
    assert gone(reader) and readers(os.getpid()) == []
    # Stopped, not failed: the exit ended the read.
    assert got(s).results == {"taken": 0, "busy": 0, "failed": 0, "skipped": 0}
    assert list(temporary.iterdir()) == []


def test_a_child_past_its_time_is_killed_and_a_stopped_reader_starts_none() -> None:
    windows = [(START_UNIX_NS, START_UNIX_NS + 50_000)]
    reader = Reader(0, timeout=0.5)  # the big trace takes seconds to read
    with pytest.raises(TimeoutError, match=r"more than 0\.5 s"):
        reader.split(big_trace(), Catalog(), windows)
    assert readers(os.getpid()) == []  # killed and reaped
    reader.stop()
    with pytest.raises(Stopped):
        reader.split(gpu_space({0: GPU0}), Catalog(), windows)
    assert readers(os.getpid()) == []


def test_a_read_only_temporary_directory_reads_large_traces_all_the_same(
    samplers: list[Sampler], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    completions = [(9, at(0)), (10, at(50)), (11, at(100))]
    here_profiler = FakeProfiler(gpu_space({0: GPU0, 1: GPU1}))
    here = run_block(sampler(samplers, here_profiler, 1 << 20), here_profiler, completions)
    with read_only(tmp_path / "read-only") as directory:
        temporary_directory(monkeypatch, directory)
        profiler = FakeProfiler(gpu_space({0: GPU0, 1: GPU1}))
        child = run_block(sampler(samplers, profiler, 0), profiler, completions)  # 0: every trace to the child
    assert child.results == {"taken": 1, "busy": 0, "failed": 0, "skipped": 0}
    assert child.devices == here.devices


class Watcher:
    """Every trace reader process `pid` starts, seen as it starts (polled every 5 ms on a thread of its own); once
    `pause` is set, the next one is stopped (SIGSTOP) at once (`paused` gets it)."""

    def __init__(self, pid: int, paused: list[int]) -> None:
        self.pid, self.paused = pid, paused
        self.seen: list[int] = []
        self.pause = threading.Event()
        self.stopped = threading.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._done.is_set():
            for reader in readers(self.pid):
                if reader not in self.seen:
                    self.seen.append(reader)
                    if self.pause.is_set() and not self.stopped.is_set():
                        os.kill(reader, signal.SIGSTOP)
                        self.paused.append(reader)
                        self.stopped.set()
            time.sleep(0.005)

    def close(self) -> None:
        self._done.set()
        self._thread.join()


def results(child: Child) -> dict[str, float]:
    """The child's samples by result."""
    s = parse_samples(requests.get(child.hello["url"] + "/metrics", timeout=10).text)
    return {dict(k)["result"]: v for (name, k), v in s.items() if name == "jaxmon_training_profiles_total"}


def run_blocks(child: Child, until: Callable[[], bool], what: str) -> None:
    """The steps up to the end of the next sampled block (every 10 steps, 2 steps each), 20 ms apart (the trace
    starts before its steps), each block's sample waited for until it is counted, until `until()` (5 blocks at most:
    a sample a loaded machine's slow trace start missed is counted failed, and the next block is another)."""
    for _ in range(5):
        counted = sum(results(child).values())
        handed = child.hello.setdefault("handed", 0)
        block = -(-(handed + 2) // 10) * 10  # its trace starts as step block - 2 is handed: one not handed yet
        child.hello["handed"] = child.send(f"run {block + 2 - handed} 20")["steps"]

        def done(before: float = counted) -> bool:
            return until() or sum(results(child).values()) > before

        wait_until(done, 60, "the block's sample counted", step=0.05, detail=child.log)
        if until():
            return
    raise AssertionError(f"{what} not seen in 5 blocks: {results(child)}\n{child.log()[-3000:]}")


def test_the_exit_of_a_training_process_kills_its_trace_reader_and_leaves_no_file(
    tmp_path: Path, paused: list[int]
) -> None:
    """A real training process (tests/workloads/big_trace.py): its sampled traces are megabytes, read by a child;
    one is read to the end and taken, then the next reader is stopped (SIGSTOP) as it starts and the process told
    to exit: it exits without waiting for the read (EXIT_WAIT is what jaxmon's exit waits for its threads at most),
    the reader killed and reaped, no file left in its temporary directory."""
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    child = Child(tmp_path, "--every", "10", script=BIG_TRACE, env={"TMPDIR": str(temporary)})
    watcher = Watcher(child.hello["pid"], paused)
    try:
        run_blocks(child, lambda: results(child).get("taken", 0) >= 1, "a sample taken")
        assert watcher.seen and all(gone(r) for r in watcher.seen), watcher.seen  # read by children, which ended
        watcher.pause.set()
        run_blocks(child, watcher.stopped.is_set, "a reader started")
        [reader] = watcher.paused
        assert child.proc.stdin is not None
        child.proc.stdin.write("exit\n")
        child.proc.stdin.flush()
        child.proc.wait(EXIT_WAIT / 2)  # a wait for the reader would be EXIT_WAIT (and a stopped one never ends)
        assert child.proc.returncode == 0, child.log()[-3000:]
        wait_until(lambda: gone(reader), 10, "the reader reaped")
        assert list(temporary.iterdir()) == []
    finally:
        watcher.close()
        child.close()
