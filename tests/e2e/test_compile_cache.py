"""Persistent compilation cache misses as JAX really reports them: a real trainer process with the cache on, its
thresholds at 0 and then at their defaults, embedded and through the spool to a sidecar.

The truth is the loop's own: the number of new programs it compiled, and the entries JAX wrote to the cache
directory (`<key>-cache` files). JAX's `cache_misses` event fires only when an entry is written, and at the default
thresholds (a compilation under 1 s is not written) no toy program is: a miss counter made of that event reads 0.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import Samples, StartDaemon, sample
from tests.helpers import Child, wait_for_fresh_samples, wait_for_samples

PROGRAMS = 4
ZERO_THRESHOLDS = {
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
}


def entries(cache: Path) -> int:
    """Entries JAX has written to the persistent cache (jax/_src/lru_cache.py: one `<key>-cache` file each)."""
    return len(list(cache.glob("*-cache"))) if cache.exists() else 0


def counters(s: Samples, workload: str) -> tuple[float | None, float | None]:
    labels = {"workload": workload, "process_index": "0"}
    return (
        sample(s, "jaxmon_compilation_cache_misses_total", **labels),
        sample(s, "jaxmon_compilation_cache_hits_total", **labels),
    )


def check_misses(
    child: Child, cache: Path, zero: bool, fresh: Callable[[], Samples], wait: Callable[..., Samples], workload: str
) -> None:
    """Compile PROGRAMS new programs, then the same again after clearing the in-memory caches: the misses and hits
    exported against the programs compiled and the entries written."""
    child.send("alloc 0 4096")
    misses0, hits0 = counters(fresh(), workload)  # read after every compilation so far (start-up, the step)
    written0 = entries(cache)
    assert misses0 is not None and hits0 == 0
    assert child.send(f"compile {PROGRAMS}") == {"compiled": PROGRAMS}
    # Every new program missed, whether or not JAX wrote it: at the defaults it wrote none of them.
    written = entries(cache) - written0
    assert written == (PROGRAMS if zero else 0)
    wait(lambda s: counters(s, workload) == (misses0 + PROGRAMS, 0), what=f"{PROGRAMS} misses")
    assert child.send("recompile") == {"recompiled": PROGRAMS}
    # The same programs after jax.clear_caches(): found when they were written, missed again when not.
    expected = (misses0 + PROGRAMS, PROGRAMS) if zero else (misses0 + 2 * PROGRAMS, 0)
    wait(lambda s: counters(s, workload) == expected, what=f"misses and hits {expected}")
    assert entries(cache) - written0 == written  # a hit writes nothing, and the defaults still write nothing
    # Nothing more comes later: updates that read the counters after the compilations say the same.
    assert counters(fresh(), workload) == expected


@pytest.mark.parametrize("zero", [True, False], ids=["thresholds-0", "default-thresholds"])
def test_an_embedded_trainers_cache_misses_are_its_compilations_that_found_nothing(
    children: list[Child], tmp_path: Path, zero: bool
) -> None:
    cache = tmp_path / "jax-cache"
    env = {"JAXMON_COLLECTOR__PROBE": "false", "JAX_COMPILATION_CACHE_DIR": str(cache)}
    child = Child(
        tmp_path, "embedded", "--workload", "cached", "--interval", "0.2", env=env | (ZERO_THRESHOLDS if zero else {})
    )
    children.append(child)
    url = child.hello["url"]

    def wait(predicate: Callable[[Samples], bool], what: str) -> Samples:
        return wait_for_samples(url, predicate, what)

    check_misses(child, cache, zero, lambda: wait_for_fresh_samples(url, "compile"), wait, "cached")


def test_a_publishing_trainers_cache_misses_reach_the_sidecar(
    children: list[Child], tmp_path: Path, start_daemon: StartDaemon
) -> None:
    cache, spool = tmp_path / "jax-cache", tmp_path / "spool"
    env = {"JAXMON_COLLECTOR__PROBE": "false", "JAX_COMPILATION_CACHE_DIR": str(cache)}  # default thresholds
    child = Child(tmp_path, "publish", "--spool", str(spool), "--workload", "pubcache", "--interval", "0.2", env=env)
    children.append(child)
    d = start_daemon("--no-collector.probe", "--collector.spool.dir", str(spool), "--poll.interval", "0.2s")
    ident = {"workload": "pubcache", "process_index": "0"}

    def report(s: Samples) -> float:
        return sample(s, "jaxmon_workload_last_report_timestamp_seconds", **ident) or 0.0

    def fresh() -> Samples:
        # A report written after this call, then another: the second read the counters after the call.
        since = time.time()
        first = report(d.wait_for(lambda s: report(s) > since, what="a report after now"))
        return d.wait_for(lambda s: report(s) > first, what="another report")

    check_misses(child, cache, False, fresh, d.wait_for, "pubcache")
