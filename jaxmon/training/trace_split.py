"""A sampled trace read and split over its steps' windows: on the sampler's thread when the trace is small, in a child
process of its own when it is large.

Reading a trace is pure Python over every event (jaxmon.xla.profile): 30-90 ms of CPU a megabyte here (BENCHMARKS.md).
On the sampler's thread that time holds the GIL in 5 ms turns, and a training thread that dispatches steps back to back
waits for it: on a TPU v5e chip a sample of steps of thousands of XLA ops each (tens of megabytes) slowed a loop of 0.36
ms steps by 16-33 % while it was read. A trace of more than IN_PROCESS_BYTES is read by a child Python (the same
interpreter, `python -m jaxmon.training.trace_split`, at a lower CPU priority) that shares no GIL with the job.

The child never holds the job: everything goes through its pipes (the catalog and windows, then the trace, on its stdin;
the split on its stdout; pickle, between jaxmon's own processes), so no temporary file is written (a read-only temporary
directory reads the same) and none is left behind; `Reader.stop()` (the sampler's stop, at the process's exit too) kills
a child that is reading, so the exit never waits for a parse. Nothing here imports JAX.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import struct
import subprocess
import sys
import threading

from jaxmon.training.trace_links import Catalog, PlacedTotals, splits
from jaxmon.xla.profile import read

# Traces up to this size (bytes) are read on the sampler's thread (30-90 ms of CPU a megabyte); larger ones in a
# child process.
IN_PROCESS_BYTES = 1 << 20
# The child's time to read and split a trace (seconds): a trace of a few hundred megabytes takes about a minute.
CHILD_TIMEOUT = 300.0
# The child's CPU priority below the job's (os.nice): its parse gives way to the job's own threads.
CHILD_NICE = 10
# How long stop() waits for a killed child to be reaped (seconds): SIGKILL ends it at once.
REAP_WAIT = 5.0
# The child's stdin: the length of the pickled (catalog, windows) as 8 bytes, that pickle, then the trace.
_LENGTH = struct.Struct("<Q")

# Each device's (seconds, [compute, collective, copy, idle], collectives by op, placed totals): trace_links.splits.
Splits = dict[tuple[str, int], tuple[float, list[float], dict[str, float], PlacedTotals]]


class Stopped(Exception):
    """The reader was stopped: the trace is not read (a child reading it was killed)."""


def split_trace(data: bytes, catalog: Catalog, windows: list[tuple[int, int]]) -> Splits | None:
    """`data` (a serialized XSpace) split over `windows` (Unix ns): None when it holds none of them whole."""
    trace = read(data, catalog)
    lo, hi = trace.extent_ns()
    inside = [(trace.trace_ns(a), trace.trace_ns(b)) for a, b in windows]
    inside = [(a, b) for a, b in inside if lo <= a <= b <= hi]
    return splits(trace, inside) if inside else None


class Reader:
    """Splits sampled traces: up to `limit` bytes on the calling thread, larger ones in a child process (one at a
    time: the sampler's thread calls it), which `stop()` kills."""

    def __init__(self, limit: int = IN_PROCESS_BYTES, timeout: float = CHILD_TIMEOUT) -> None:
        self.limit = limit
        self.timeout = timeout
        self._lock = threading.Lock()
        self._stopped = False
        self._child: subprocess.Popen[bytes] | None = None

    def split(self, data: bytes, catalog: Catalog, windows: list[tuple[int, int]]) -> Splits | None:
        """split_trace() of `data`, here or in a child (raises what the child said when it failed: a trace it could
        not read, a timeout; Stopped once stop() was called). A process with no Python executable to start (an
        embedded interpreter) reads it here."""
        if len(data) <= self.limit or not sys.executable:
            return split_trace(data, catalog, windows)
        header = pickle.dumps((catalog, windows))
        with self._lock:
            if self._stopped:
                raise Stopped("the trace's reader was stopped")
            child = self._child = subprocess.Popen(
                [sys.executable, "-m", __name__],
                bufsize=0,  # unbuffered pipes: what is written is the child's, nothing waits in a buffer
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
        with child:  # its pipes closed and the child reaped on the way out
            try:
                out, err = self._talk(child, header, data)
            finally:
                with self._lock:
                    self._child = None
                if child.poll() is None:  # a timeout or an error here: the child goes too
                    child.kill()
        if self._stopped:
            raise Stopped("the trace's reader was stopped while a child read it")
        if child.returncode != 0:
            said = err.decode(errors="replace").strip().splitlines()
            raise RuntimeError(f"the trace's reader process failed ({child.returncode}): {said[-1] if said else ''}")
        result: Splits | None = pickle.loads(out)
        return result

    def _talk(self, child: subprocess.Popen[bytes], header: bytes, data: bytes) -> tuple[bytes, bytes]:
        """Feed the child its input and read what it answers, within the timeout (raises TimeoutError)."""
        assert child.stdin is not None
        view = memoryview(_LENGTH.pack(len(header)) + header)
        with contextlib.suppress(BrokenPipeError):  # a child that ended (or was killed) says why on stderr
            while view:  # the child's first read: it takes all of it
                view = view[child.stdin.write(view) or 0 :]
        try:
            # communicate() writes the trace from its own buffer (no copy) as the child takes it, and reads.
            return child.communicate(data, timeout=self.timeout)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"the trace's reader process took more than {self.timeout:g} s") from None

    def stop(self) -> None:
        """Kill the child reading a trace, if one is, and read no more (the exit waits for no parse)."""
        with self._lock:
            self._stopped = True
            child = self._child
        if child is not None and child.poll() is None:
            child.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(REAP_WAIT)


def split(
    data: bytes, catalog: Catalog, windows: list[tuple[int, int]], limit: int = IN_PROCESS_BYTES
) -> Splits | None:
    """split_trace() here for a trace of up to `limit` bytes, in a child process for a larger one (Reader.split)."""
    return Reader(limit).split(data, catalog, windows)


def main() -> None:
    """The child: on stdin the length of the pickled (catalog, windows), that pickle, then the trace; the split on
    stdout."""
    with contextlib.suppress(OSError):  # a priority it may not lower: it reads at the job's
        os.nice(CHILD_NICE)
    stdin = sys.stdin.buffer
    (length,) = _LENGTH.unpack(stdin.read(_LENGTH.size))
    catalog, windows = pickle.loads(stdin.read(length))
    result = split_trace(stdin.read(), catalog, windows)
    sys.stdout.buffer.write(pickle.dumps(result))


if __name__ == "__main__":
    main()
