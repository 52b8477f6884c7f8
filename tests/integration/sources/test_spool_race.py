"""Atomic spool writes (jaxmon.files.write_atomically) that a reader racing the writer never sees torn: a loop of
synced writes, counted rather than timed, which takes seconds on a busy disk (tests/unit/sources/test_spool.py has
the spool source's other claims)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from jaxmon.files import write_atomically
from jaxmon.sources.spool_document import read_document
from tests.conftest import FIXTURES


def test_a_reader_racing_a_writer_never_sees_a_torn_file(tmp_path: Path) -> None:
    """The reader reads while the writer replaces the file, alternating small and large documents, until the reader
    has read each size many times and the writer has written many of each. Counts, not a fixed time: every write
    syncs the file, which a busy disk (other suites beside this one) makes slow."""
    path = tmp_path / "w.json"
    good = json.loads((FIXTURES / "spool_document.json").read_text())
    stop = threading.Event()
    writes = 0

    def writer() -> None:
        nonlocal writes
        while not stop.is_set():
            doc = dict(good)
            # Alternate small and large documents so a torn read would be likely if writes were not atomic.
            doc["devices"] = good["devices"] * (1 if writes % 2 else 400)
            doc["time"] = time.time()
            write_atomically(path, doc)
            writes += 1

    write_atomically(path, good)
    thread = threading.Thread(target=writer)
    thread.start()
    seen = {"small": 0, "large": 0}
    deadline = time.monotonic() + 120.0
    try:
        while min(seen.values()) < 25 or writes < 100:
            assert time.monotonic() < deadline, f"read {seen}, {writes} writes in 120 s"
            document = read_document(path, max_bytes=1 << 24)  # raises Rejected on a torn file
            seen["large" if len(document.devices) > len(good["devices"]) else "small"] += 1
    finally:
        stop.set()
        thread.join()
    assert not [p for p in tmp_path.iterdir() if p.name != "w.json"], "temporary files left behind"
