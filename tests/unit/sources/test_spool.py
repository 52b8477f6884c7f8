"""The spool source (jaxmon/sources/spool.py) in-process: what read_document rejects and why, the reader's cache
of each file's outcome, and atomic writes that a racing reader never sees torn.

The daemon against hostile and overwhelming spool directories is tests/e2e/test_spool_hardening.py; real
publishing processes are tests/e2e/test_workloads.py.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from jaxmon.files import write_atomically
from jaxmon.sources.spool import SpoolReader
from jaxmon.sources.spool_document import Rejected, read_document
from tests.conftest import FIXTURES
from tests.spool_files import GOOD, doc, write


def test_read_document_names_what_is_wrong_with_each_bad_number(tmp_path: Path) -> None:
    cases: dict[str, tuple[dict[str, Any] | str, str]] = {
        "huge": ({**GOOD, "pid": 10**400}, "pid: Input should be less than or equal to 9223372036854775807"),
        "inf_float": (json.dumps(GOOD).replace('"compile_seconds": 0.5', '"compile_seconds": 1e400'), "finite"),
        "negative_time": ({**GOOD, "time": -5}, "time: Input should be greater than or equal to 0"),
    }
    for name, (payload, message) in cases.items():
        path = tmp_path / f"{name}.json"
        write(path, payload)
        try:
            read_document(path, 1 << 20)
        except Rejected as exc:
            assert exc.reason == "bad_schema", name
            assert message in str(exc), (name, str(exc))
        else:
            raise AssertionError(f"{name} was accepted")


def test_the_reader_caches_each_files_outcome_and_reads_only_changed_files(tmp_path: Path) -> None:
    reads: list[str] = []

    def derive(d: Any) -> str:
        reads.append(d.workload)
        if d.workload == "raises":
            raise OverflowError("derived number too large")
        return str(d.workload)

    write(tmp_path / "a.h.1.json", doc("a"))
    write(tmp_path / "raises.h.2.json", doc("raises"))
    reader = SpoolReader(tmp_path, ttl=30.0, derive=derive)
    first = reader.scan()
    assert [f.value for f in first.live] == ["a"]
    assert first.rejected["error"] == 1
    second = reader.scan()
    assert [f.value for f in second.live] == ["a"] and second.rejected["error"] == 1
    assert reads == ["a", "raises"]  # unchanged files are not read again
    write(tmp_path / "a.h.1.json", doc("a", pid=7))
    reader.scan()
    assert reads == ["a", "raises", "a"]


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


def test_read_document_rejects_non_regular_files(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "f.json")
    with pytest.raises(Rejected) as err:
        read_document(tmp_path / "f.json", 1024)
    assert err.value.reason == "not_a_file"
