"""The NVML source's reader threads (jaxmon/sources/nvml/library.py `_Readers`) and its per-process utilization
reduction (process_util.py), with no library: reads are Python functions here, NVML's calls are
tests/e2e/sources/test_nvml.py's."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from jaxmon.sources.nvml import GpuReading, ProcessUtilization
from jaxmon.sources.nvml.process_util import reduce
from jaxmon.sources.nvml.readers import IDLE_NAME, reader_name
from jaxmon.sources.nvml.readers import Readers as _Readers


def _threads() -> list[str]:
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("jaxmon-nvml-"))


def test_prompt_reads_share_one_thread_and_a_hung_one_is_passed_by_the_queue() -> None:
    wedged = threading.Event()
    release = threading.Event()
    calls: list[tuple[int, str, int]] = []

    def read(index: int) -> GpuReading:
        calls.append((index, threading.current_thread().name, threading.get_ident()))
        if index == 0 and wedged.is_set():
            release.wait(30)
        return GpuReading(index=index, temperature_celsius=float(index))

    readers = _Readers(read)
    try:
        for _ in range(3):
            got = readers.poll([0, 1, 2, 3], lambda i: time.monotonic() + 5.0, stall=1.0)
            assert sorted(got) == [0, 1, 2, 3]
        assert len({ident for _, _, ident in calls}) == 1 and _threads() == [IDLE_NAME]
        assert [name for _, name, _ in calls[:4]] == [reader_name(i) for i in range(4)]  # named for its GPU

        wedged.set()
        started = time.monotonic()
        got = readers.poll([0, 1, 2, 3], lambda i: started + 1.5, stall=0.1)
        assert sorted(got) == [1, 2, 3], "the GPUs behind the hung one are read within the deadline"
        assert 1.5 <= time.monotonic() - started < 5.0  # the poll waited for GPU 0 until its deadline, no longer
        assert readers.busy() == {0}
        assert _threads().count(reader_name(0)) == 1
        # Next poll: GPU 0 is not queued again while its read hangs; the others are read, by one idle thread.
        got = readers.poll([1, 2, 3], lambda i: time.monotonic() + 5.0, stall=1.0)
        assert sorted(got) == [1, 2, 3]
        assert _threads() == sorted([reader_name(0), IDLE_NAME])
        release.set()
        deadline = time.monotonic() + 10
        while readers.busy() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert readers.busy() == set()
        wedged.clear()
        got = readers.poll([0, 1, 2, 3], lambda i: time.monotonic() + 5.0, stall=1.0)
        assert got[0] == GpuReading(index=0, temperature_celsius=0.0), "a fresh read, not the late one's result"
    finally:
        release.set()
        readers.stop()
        readers.join(time.monotonic() + 5)
    assert _threads() == []


def test_a_read_that_raises_is_its_gpus_error_and_the_thread_goes_on() -> None:
    def read(index: int) -> GpuReading:
        if index == 1:
            raise RuntimeError("boom")
        return GpuReading(index=index)

    readers = _Readers(read)
    try:
        got = readers.poll([0, 1, 2], lambda i: time.monotonic() + 5.0, stall=1.0)
        assert got[1].error == "RuntimeError: boom" and got[0].up and got[2].up
    finally:
        readers.stop()
        readers.join(time.monotonic() + 5)


def test_samples_reduce_to_each_pids_mean_as_ratios() -> None:
    def sample(pid: int, sm: int, mem: int, enc: int = 0, dec: int = 0) -> SimpleNamespace:
        return SimpleNamespace(pid=pid, timeStamp=1, smUtil=sm, memUtil=mem, encUtil=enc, decUtil=dec)

    got = reduce([sample(9, 40, 10), sample(3, 5, 1, 2, 3), sample(9, 80, 30, 4, 0)])
    assert got == (ProcessUtilization(3, 0.05, 0.01, 0.02, 0.03, 1), ProcessUtilization(9, 0.6, 0.2, 0.02, 0.0, 2))
    assert reduce([]) == ()
