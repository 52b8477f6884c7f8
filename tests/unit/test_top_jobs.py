"""`jaxmon top`'s job view from literal expositions: a workload's processes across endpoints, the slowest marked."""

from __future__ import annotations

import io

from rich.console import Console

from jaxmon.top.fetch import EndpointState
from jaxmon.top.jobs import jobs
from jaxmon.top.rows import parse_exposition, recent_step_times
from jaxmon.top.view import ASCII, frame


def _exposition(index: int, waited: float, elapsed: float, dispatched: int, workload: str = "llama") -> str:
    """What process `index` of a 4-process job's embedded jaxmon exports (one CPU device each)."""
    labels = f'process_count="4",process_index="{index}",workload="{workload}"'
    return "\n".join(
        [
            f'jaxmon_device_info{{device="{index}",device_kind="cpu",platform="cpu",{labels},source="local"}} 1',
            f'jaxmon_memory_live_array_bytes{{device="{index}",platform="cpu",workload="{workload}"}} 1024',
            f"jaxmon_training_step{{{labels}}} {dispatched - 1}",
            f"jaxmon_training_dispatched_step{{{labels}}} {dispatched}",
            f"jaxmon_training_step_duration_seconds_sum{{{labels}}} 10.0",
            f"jaxmon_training_step_duration_seconds_count{{{labels}}} 100",
            f"jaxmon_training_host_wait_seconds_total{{{labels}}} {waited}",
            f"jaxmon_training_start_time_seconds{{{labels}}} 1700000000",
            f"jaxmon_training_last_step_timestamp_seconds{{{labels}}} {1700000000 + elapsed}",
            "",
        ]
    )


def test_the_host_wait_share_is_over_the_workloads_own_clock_not_a_stepped_wall_clock() -> None:
    """The timestamps are the wall clock's at each event: an hour's step of it between the start and the last
    completion is no hour of the workload's. Productive plus badput is its time on its monotonic clock."""

    def exposition(waited: float, elapsed: float, step: float) -> str:
        labels = 'process_count="4",process_index="0",workload="llama"'
        accounted = [
            f"jaxmon_training_productive_seconds_total{{{labels}}} {elapsed - waited}",
            f'jaxmon_training_badput_seconds_total{{kind="host",{labels}}} {waited / 2}',
            f'jaxmon_training_badput_seconds_total{{kind="data",{labels}}} {waited / 2}',
        ]
        text = _exposition(0, waited, elapsed, 500).replace(f"{1700000000 + elapsed}", f"{1700000000 + elapsed + step}")
        return text + "\n".join(accounted) + "\n"

    old = parse_exposition(exposition(10.0, 100.0, 0.0), "h0:1")
    assert old.rows[0].host_wait_ratio == 0.1
    new = parse_exposition(exposition(18.0, 110.0, 3600.0), "h0:1")  # the clock stepped an hour meanwhile
    assert new.rows[0].host_wait_ratio == 18.0 / 110.0  # not 18 / 3710
    recent_step_times(new, old)
    assert new.rows[0].host_wait_ratio == 0.8  # 8 of the last 10 s, not 8 of 3610


def _state(name: str, text: str) -> EndpointState:
    return EndpointState(f"http://{name}/metrics", name, parse_exposition(text, name), healthy=True, last_ok=0.0)


def _plain(states: list[EndpointState]) -> str:
    buffer = io.StringIO()
    console = Console(file=buffer, width=220, height=60, force_terminal=False, no_color=True)
    console.print(frame(states, "device", 0.0, 10.0, ASCII, False, console))
    return buffer.getvalue()


def test_the_processes_of_a_workload_group_across_endpoints_and_the_most_waiting_is_the_slowest() -> None:
    # Since start: process 2's devices waited 60 of 100 s for its host, the others 1 s.
    states = [_state(f"h{i}:1", _exposition(i, 60.0 if i == 2 else 1.0, 100.0, 500 + (i != 2))) for i in range(4)]
    (job,) = jobs(r for s in states for r in s.rows(0.0, 10.0))
    assert job.workload == "llama" and len(job.processes) == 4
    assert job.slowest is not None and (job.slowest.process_index, job.slowest.endpoint) == ("2", "h2:1")
    assert job.processes[0] is job.slowest and job.slowest.host_wait_ratio == 0.6
    assert job.median_step_time == 0.1
    text = _plain(states)
    assert "job llama: 4 processes, median step 100.0ms; slowest: process 2 on h2:1" in text
    assert "60.0% of the time" in text
    (marked,) = [line for line in text.splitlines() if "slowest" in line and line.split()[0] == "2"]
    assert marked.split()[:6] == ["2", "h2:1", "499", "500", "100.0ms", "60.0%"]
    # Its device row says so too, and no other.
    device_rows = [line for line in text.splitlines() if line.startswith("h") and "cpu:" in line]
    assert [line.split()[0] for line in device_rows if line.rstrip().endswith("slowest")] == ["h2:1"]


def test_the_host_wait_share_is_that_since_the_previous_scrape() -> None:
    old = parse_exposition(_exposition(0, 1.0, 100.0, 500), "h0:1")
    new = parse_exposition(_exposition(0, 9.0, 110.0, 600), "h0:1")  # 8 s of the last 10 s waited
    recent_step_times(new, old)
    (row,) = new.rows
    assert row.host_wait_ratio == 0.8
    restarted = parse_exposition(_exposition(0, 0.5, 5.0, 10), "h0:1")  # the counters began again
    recent_step_times(restarted, new)
    assert restarted.rows[0].host_wait_ratio == 0.1  # since its start, not a negative share


def test_a_job_of_one_or_of_equals_has_no_slowest_process_and_other_workloads_are_separate() -> None:
    states = [_state("a:1", _exposition(0, 5.0, 100.0, 7, workload="solo"))]
    states += [_state(f"e{i}:1", _exposition(i, 5.0, 100.0, 7, workload="even")) for i in range(3)]
    found = {j.workload: j for j in jobs(r for s in states for r in s.rows(0.0, 10.0))}
    assert set(found) == {"solo", "even"}
    assert found["solo"].slowest is None and found["even"].slowest is None
    text = _plain(states)
    assert "job even: 3 processes" in text and "job solo: 1 process," in text and "slowest" not in text


def test_no_job_section_without_training_series() -> None:
    state = _state("h:1", 'jaxmon_device_up{device="0",platform="gpu"} 1\n')
    assert jobs(state.rows(0.0, 10.0)) == []
    assert "job " not in _plain([state])
