"""A sampled trace read and split over its steps' windows: on the sampler's thread when the trace is small, in a
child process of its own when it is large.

Reading a trace is pure Python over every event (jaxmon.xla.profile): about 130 ms of CPU per megabyte here. On the
sampler's thread that time holds the GIL in 5 ms turns, and a training thread that dispatches steps back to back
waits for it: on a TPU v5e chip a sample of steps of thousands of XLA ops each (tens of megabytes) slowed a loop of
0.36 ms steps by 16-33 % while it was read. A trace of more than IN_PROCESS_BYTES is read by a child Python (the same
interpreter, `python -m jaxmon.training.trace_split`, at a lower CPU priority) that shares no GIL with the job: the
trace goes through a temporary file, the catalog and windows in, the split out through pipes (pickle, between
jaxmon's own processes). Nothing here imports JAX.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

from jaxmon.training.trace_links import Catalog, PlacedTotals, splits
from jaxmon.xla.profile import read

# Traces up to this size (bytes) are read on the sampler's thread (about 130 ms of CPU a megabyte); larger ones in a
# child process.
IN_PROCESS_BYTES = 1 << 20
# The child's time to read and split a trace (seconds): a trace of a few hundred megabytes takes about a minute.
CHILD_TIMEOUT = 300.0
# The child's CPU priority below the job's (os.nice): its parse gives way to the job's own threads.
CHILD_NICE = 10

# Each device's (seconds, [compute, collective, copy, idle], collectives by op, placed totals): trace_links.splits.
Splits = dict[tuple[str, int], tuple[float, list[float], dict[str, float], PlacedTotals]]


def split_trace(data: bytes, catalog: Catalog, windows: list[tuple[int, int]]) -> Splits | None:
    """`data` (a serialized XSpace) split over `windows` (Unix ns): None when it holds none of them whole."""
    trace = read(data, catalog)
    lo, hi = trace.extent_ns()
    inside = [(trace.trace_ns(a), trace.trace_ns(b)) for a, b in windows]
    inside = [(a, b) for a, b in inside if lo <= a <= b <= hi]
    return splits(trace, inside) if inside else None


def split(
    data: bytes, catalog: Catalog, windows: list[tuple[int, int]], limit: int = IN_PROCESS_BYTES
) -> Splits | None:
    """split_trace() here for a trace of up to `limit` bytes, in a child process for a larger one (raises what the
    child said when it failed: a trace it could not read, a timeout). A process with no Python executable to start
    (an embedded interpreter) reads it here."""
    if len(data) <= limit or not sys.executable:
        return split_trace(data, catalog, windows)
    with tempfile.NamedTemporaryFile(prefix="jaxmon-trace-", suffix=".xplane.pb") as file:
        file.write(data)
        file.flush()
        proc = subprocess.run(
            [sys.executable, "-m", __name__, file.name],
            input=pickle.dumps((catalog, windows)),
            capture_output=True,
            timeout=CHILD_TIMEOUT,
            check=False,
        )
    if proc.returncode != 0:
        said = proc.stderr.decode(errors="replace").strip().splitlines()
        raise RuntimeError(f"the trace's reader process failed ({proc.returncode}): {said[-1] if said else ''}")
    result: Splits | None = pickle.loads(proc.stdout)
    return result


def main() -> None:
    """The child: the trace's path as its argument, (catalog, windows) pickled on stdin; the split on stdout."""
    with contextlib.suppress(OSError):  # a priority it may not lower: it reads at the job's
        os.nice(CHILD_NICE)
    catalog, windows = pickle.load(sys.stdin.buffer)
    result = split_trace(Path(sys.argv[1]).read_bytes(), catalog, windows)
    sys.stdout.buffer.write(pickle.dumps(result))


if __name__ == "__main__":
    main()
