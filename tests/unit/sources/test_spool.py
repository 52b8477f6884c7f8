"""The spool source (jaxmon/sources/spool.py) in-process: what read_document rejects and why, the reader's cache
of each file's outcome. Atomic writes that a racing reader never sees torn (a loop of synced writes, seconds on a busy
disk) are tests/integration/sources/test_spool_race.py's.

The daemon against hostile and overwhelming spool directories is tests/e2e/test_spool_hardening.py; real
publishing processes are tests/e2e/test_workloads.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from jaxmon.sources.spool import SpoolReader
from jaxmon.sources.spool_document import Rejected, read_document
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


def test_read_document_rejects_non_regular_files(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "f.json")
    with pytest.raises(Rejected) as err:
        read_document(tmp_path / "f.json", 1024)
    assert err.value.reason == "not_a_file"
