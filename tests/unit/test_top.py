"""`jaxmon top`: parsing and rendering of literal expositions, URLs, and the arguments it refuses, in-process.

--once against real daemons and loopback peers is tests/e2e/test_top.py."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from jaxmon.top import main as top_main
from jaxmon.top.fetch import EndpointState, clip, display_name, healthz_url, metrics_url
from jaxmon.top.rows import ScrapeError, next_sort, parse_exposition, sort_rows
from jaxmon.top.view import ASCII, frame
from tests.conftest import FIXTURES

MiB = 1 << 20
GiB = 1 << 30
SHAPES = FIXTURES / "shapes.json"
REPLAY = ("--replay", str(SHAPES), "--poll.interval", "1s")

# Two devices of one daemon plus a spooled workload on device 0, and NVML's device-wide numbers for device 0 and for a
# device no JAX client holds (2). Every value is chosen so the expected cells can be written out by hand below.
EXPOSITION = """\
# TYPE jaxmon_memory_bytes_in_use gauge
jaxmon_memory_bytes_in_use{device="0",platform="gpu"} 3221225472
jaxmon_memory_bytes_in_use{device="1",platform="gpu"} 1073741824
jaxmon_memory_bytes_in_use{device="0",platform="gpu",workload="trainer"} 536870912
# TYPE jaxmon_memory_limit_bytes gauge
jaxmon_memory_limit_bytes{device="0",platform="gpu"} 10737418240
jaxmon_memory_limit_bytes{device="1",platform="gpu"} 2147483648
# TYPE jaxmon_memory_free_bytes gauge
jaxmon_memory_free_bytes{device="0",platform="gpu"} 7516192768
jaxmon_memory_free_bytes{device="1",platform="gpu"} 1073741824
# TYPE jaxmon_memory_fragmentation_ratio gauge
jaxmon_memory_fragmentation_ratio{device="0",platform="gpu"} 0.125
# TYPE jaxmon_memory_largest_allocatable_bytes gauge
jaxmon_memory_largest_allocatable_bytes{device="0",platform="gpu"} 6442450944
# TYPE jaxmon_memory_read_success gauge
jaxmon_memory_read_success{device="0",platform="gpu"} 1
jaxmon_memory_read_success{device="1",platform="gpu"} 0
# TYPE jaxmon_device_up gauge
jaxmon_device_up{device="0",platform="gpu"} 1
jaxmon_device_up{device="1",platform="gpu"} 0
# TYPE jaxmon_device_utilization_ratio gauge
jaxmon_device_utilization_ratio{device="0",platform="gpu"} 0.4
# TYPE jaxmon_device_info gauge
jaxmon_device_info{device="0",device_kind="NVIDIA H100",platform="gpu",source="local"} 1
# TYPE jaxmon_device_duty_cycle_ratio gauge
jaxmon_device_duty_cycle_ratio{device="0",platform="gpu",source="nvml"} 0.875
jaxmon_device_duty_cycle_ratio{device="2",platform="gpu",source="nvml"} 0.5
# TYPE jaxmon_device_memory_used_bytes gauge
jaxmon_device_memory_used_bytes{device="0",platform="gpu",source="nvml"} 64424509440
# TYPE jaxmon_device_memory_total_bytes gauge
jaxmon_device_memory_total_bytes{device="0",platform="gpu",source="nvml"} 85899345920
# TYPE jaxmon_device_source_up gauge
jaxmon_device_source_up{device="0",platform="gpu",source="nvml"} 1
jaxmon_device_source_up{device="1",platform="gpu",source="nvml"} 0
jaxmon_device_source_up{device="2",platform="gpu",source="nvml"} 1
# TYPE jaxmon_collector_success gauge
jaxmon_collector_success{collector="memory"} 0
jaxmon_collector_success{collector="probe"} 1
"""
# A workload's CPU devices, where memory_stats() is None: live jax.Array bytes are the only memory number.
LIVE_ARRAYS = """\
# TYPE jaxmon_memory_live_array_bytes gauge
jaxmon_memory_live_array_bytes{device="0",platform="cpu",workload="toy"} 81788928
jaxmon_memory_live_array_bytes{device="1",platform="cpu",workload="toy"} 1048576
"""
# NVML's compute processes: the trainer's (its spool report has the pid), and three no workload report claims.
PROCESSES = """\
# TYPE jaxmon_process_device_memory_bytes gauge
jaxmon_process_device_memory_bytes{device="0",pid="4242",platform="gpu",source="nvml",workload="trainer"} 21474836480
jaxmon_process_device_memory_bytes{device="0",pid="977",platform="gpu",source="nvml"} 1073741824
jaxmon_process_device_memory_bytes{device="1",pid="5150",platform="gpu",source="nvml"} 9663676416
jaxmon_process_device_memory_bytes{device="2",pid="31",platform="gpu",source="nvml"} 1073741824
"""


def _cells(text: str, device: str, workload: str | None = None) -> list[str]:
    """The whitespace-separated cells of the row of `device` (and `workload`) in a plain frame."""
    for line in text.splitlines():
        cells = line.split()
        if len(cells) > 1 and cells[1] == device and (workload is None or workload in cells):
            return cells
    raise AssertionError(f"no row for {device} in:\n{text}")


def _plain(*states: EndpointState, sort: str = "device", height: int = 25, process_rows: int | None = 10) -> str:
    buffer = io.StringIO()
    console = Console(file=buffer, width=200, height=height, force_terminal=False, no_color=True)
    console.print(frame(list(states), sort, 0.0, 10.0, ASCII, False, console, process_rows))
    return buffer.getvalue()


def _state(text: str, name: str = "h:1") -> EndpointState:
    exposition = parse_exposition(text, name)
    return EndpointState(f"http://{name}/metrics", name, exposition, health="ok: fresh", healthy=True, last_ok=0.0)


def _process_table(text: str) -> tuple[list[list[str]], str | None]:
    """The cells of each process row of a plain frame, and the line after them (how many more) or None."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:3] == ["ENDPOINT", "DEVICE", "PID"])
    rows = [line.split() for line in lines[start + 1 :] if line.strip()]
    if rows and "more" in rows[-1]:
        return rows[:-1], " ".join(rows[-1])
    return rows, None


def test_each_device_and_workload_becomes_a_row_with_the_numbers_of_its_series() -> None:
    exp = parse_exposition(EXPOSITION, "h:1")
    rows = {(r.key.device, r.key.workload): r for r in exp.rows}
    assert set(rows) == {("0", ""), ("1", ""), ("0", "trainer"), ("2", "")}
    d0 = rows[("0", "")]
    assert (d0.in_use, d0.limit, d0.free) == (3 * GiB, 10 * GiB, 7 * GiB)
    assert (d0.fragmentation, d0.allocatable, d0.up, d0.probe) == (0.125, 6 * GiB, 1, 0.4)
    assert d0.kind == "NVIDIA H100"
    # NVML's numbers are device-wide: on every row of device 0, and device 2 gets a row of its own.
    for row in (d0, rows[("0", "trainer")]):
        assert (row.duty, row.duty_source, row.device_used, row.device_total) == (0.875, "nvml", 60 * GiB, 80 * GiB)
    assert (rows[("2", "")].duty, rows[("2", "")].in_use) == (0.5, None)
    assert rows[("0", "trainer")].in_use == 512 * 1024 * 1024
    assert rows[("0", "trainer")].limit is None  # absent stays absent
    assert exp.collectors == {"memory": 0, "probe": 1}
    assert exp.sources == {"nvml": (2, 3)}  # answered for devices 0 and 2, failed for 1
    assert rows[("1", "")].sources_down == ("nvml",)
    assert rows[("0", "")].sources_down == ()


def test_the_frame_shows_bar_numbers_duty_beside_probe_and_dashes_for_what_is_absent() -> None:
    text = _plain(_state(EXPOSITION))
    # gpu:0: 3 of 10 GiB in use -> 3 of 10 bar cells; free 7 GiB; 12.5 % fragmented; NVML 60 of 80 GiB, 87.5 %.
    assert _cells(text, "gpu:0") == [
        "h:1", "gpu:0", "-", "###.......", "3.0GiB/10.0GiB", "7.0GiB", "12.5%", "6.0GiB",
        "60.0GiB/80.0GiB", "87.5%", "nvml", "40.0%", "up",
    ]  # fmt: skip
    # gpu:1: half full, no fragmentation or allocatable series, probe down, memory read failed, NVML failed.
    assert _cells(text, "gpu:1") == [
        "h:1", "gpu:1", "-", "#####.....", "1.0GiB/2.0GiB", "1.0GiB", "-", "-", "-", "-", "-", "DOWN", "read-error",
        "nvml-down",
    ]  # fmt: skip
    assert _cells(text, "gpu:0", "trainer")[2:5] == ["trainer", "512.0MiB/-", "-"]
    header = text.splitlines()[0]
    assert "h:1  healthy (ok: fresh)" in header
    assert "failing collectors: memory" in header
    assert "nvml down on 1 of 3 devices" in header


def test_each_sort_puts_the_row_to_look_at_first_on_top() -> None:
    rows = parse_exposition(EXPOSITION, "h:1").rows
    order = {
        name: [(r.key.device, r.key.workload) for r in sort_rows(rows, name)]
        for name in ("device", "memory", "free", "fragmentation", "duty")
    }
    assert order["device"] == [("0", ""), ("0", "trainer"), ("1", ""), ("2", "")]
    assert order["memory"][:2] == [("1", ""), ("0", "")]  # 50 % of the limit before 30 %; no limit: last
    assert order["free"][:2] == [("1", ""), ("0", "")]  # 1 GiB free before 7 GiB
    assert order["fragmentation"][0] == ("0", "")
    assert order["duty"] == [("0", ""), ("0", "trainer"), ("2", ""), ("1", "")]  # 87.5 %, 87.5 %, 50 %, none
    cycle = ["device"]
    for _ in range(5):
        cycle.append(next_sort(cycle[-1]))
    assert cycle == ["device", "memory", "free", "fragmentation", "duty", "device"]


def test_cpu_devices_show_live_array_bytes_in_the_memory_column() -> None:
    text = _plain(_state(EXPOSITION + LIVE_ARRAYS))
    # 81788928 B = 78 MiB of live arrays; no limit, so no bar and no free memory to show.
    assert _cells(text, "cpu:0") == ["h:1", "cpu:0", "toy", "78.0MiB", "live", "-", "-", "-", "-", "-", "-", "-"]
    assert _cells(text, "cpu:1")[3:5] == ["1.0MiB", "live"]
    assert _cells(text, "gpu:0")[3:5] == ["###.......", "3.0GiB/10.0GiB"]  # the allocator's numbers where it has them


def test_the_memory_sort_puts_rows_without_a_limit_after_the_others_largest_first() -> None:
    rows = parse_exposition(EXPOSITION + LIVE_ARRAYS, "h:1").rows
    order = [(r.key.platform, r.key.device, r.key.workload) for r in sort_rows(rows, "memory")]
    assert order == [
        ("gpu", "1", ""),  # 50 % of its limit
        ("gpu", "0", ""),  # 30 %
        ("gpu", "0", "trainer"),  # 512 MiB in use, no limit
        ("cpu", "0", "toy"),  # 78 MiB of live arrays
        ("cpu", "1", "toy"),  # 1 MiB of live arrays
        ("gpu", "2", ""),  # no memory number at all
    ]


def test_the_process_table_lists_the_largest_processes_of_every_endpoint_and_counts_the_rest() -> None:
    one = 'jaxmon_process_device_memory_bytes{device="0",pid="7",platform="gpu",source="nvml"} 12884901888\n'
    other = _state("# TYPE jaxmon_process_device_memory_bytes gauge\n" + one, "h:2")
    both = (_state(EXPOSITION + PROCESSES), other)
    rows, more = _process_table(_plain(*both))
    assert rows == [
        ["h:1", "gpu:0", "4242", "trainer", "20.0GiB"],
        ["h:2", "gpu:0", "7", "-", "12.0GiB"],
        ["h:1", "gpu:1", "5150", "-", "9.0GiB"],
        ["h:1", "gpu:0", "977", "-", "1.0GiB"],  # ties by endpoint, then device
        ["h:1", "gpu:2", "31", "-", "1.0GiB"],
    ]
    assert more is None
    rows, more = _process_table(_plain(*both, process_rows=2))
    assert [r[2] for r in rows] == ["4242", "7"]
    assert more == "3 more processes not shown"


def test_the_process_table_is_absent_where_no_endpoint_exports_processes() -> None:
    alone = _plain(_state(EXPOSITION))
    assert "PID" not in alone
    assert alone.splitlines()[-1].split()[1] == "gpu:2"  # the device table's last row ends the frame
    beside = _state(EXPOSITION + PROCESSES, "h:2")
    beside.error = "connection refused"  # processes of an endpoint that went away are not shown as if current
    beside.known_rows = beside.exposition.rows if beside.exposition else []
    assert "PID" not in _plain(_state(EXPOSITION), beside)


def test_the_process_table_fills_the_screen_height_below_the_devices() -> None:
    # Above it: 2 header lines and the device table's heading and 4 rows; then a blank line, its heading, its rows.
    state = _state(EXPOSITION + PROCESSES)
    for height, shown in ((10, 0), (11, 1), (12, 2)):
        text = _plain(state, height=height, process_rows=None)
        assert len(text.splitlines()) == height
        rows, more = _process_table(text)
        assert len(rows) == shown
        assert more == f"{4 - shown} more process{'es' if 4 - shown > 1 else ''} not shown"
    for height in (13, 40):  # at 13 the 4th row takes the line the count would have had
        text = _plain(state, height=height, process_rows=None)
        rows, more = _process_table(text)
        assert ([r[2] for r in rows], more) == (["4242", "5150", "977", "31"], None)
        assert len(text.splitlines()) == 13


def test_error_text_is_cut_between_words_never_inside_one() -> None:
    assert clip("Remote end closed connection without response", 40) == "Remote end closed connection without…"
    assert clip("unauthorized\n") == "unauthorized"
    assert clip("<html>\n  <body>a very long page</body>\n</html>", 20) == "<html> <body>a very…"
    assert clip("x" * 50, 20) == "x" * 50  # one long word stays whole…
    assert clip("x" * 500, 20) == "x" * 20 + "…"  # …up to a bound


def test_an_unreachable_endpoint_keeps_its_devices_as_rows_that_say_so() -> None:
    state = _state(EXPOSITION)
    state.known_rows = state.exposition.rows if state.exposition else []
    state.error = "connection refused"
    text = _plain(state)
    assert _cells(text, "gpu:0")[2:5] == ["-", "connection", "refused"]
    assert _cells(text, "gpu:1")[-1] == "unreachable"
    assert "h:1  DOWN: connection refused" in text
    # A long reason is whole in the header; in the rows it is cut to the memory column's width, between words.
    state.error = "the connection was closed without an HTTP answer: if it serves HTTPS, use https://h:1"
    text = _plain(state)
    assert f"h:1  DOWN: {state.error}" in text
    assert _cells(text, "gpu:0")[2:8] == ["-", "the", "connection", "was", "closed…", "-"]
    never = EndpointState("http://h:2/metrics", "h:2", error="timed out")
    assert "h:2  DOWN: timed out" in _plain(never)
    assert "unreachable" in _plain(never)


def test_an_endpoint_connects_quietly_and_one_silent_past_the_limit_reads_down() -> None:
    # stale_after is 10 s in _plain; `now` there is 0.
    fresh = EndpointState("http://h:3/metrics", "h:3", created=-1.0)
    assert "h:3  connecting…" in _plain(fresh)
    assert fresh.rows(0.0, 10.0) == []
    silent = EndpointState("http://h:3/metrics", "h:3", created=-25.0)
    assert "h:3  DOWN: no answer for 25s" in _plain(silent)
    hung = _state(EXPOSITION)  # answered once, then its fetch hung past the timeout
    hung.last_ok = -12.0
    hung.known_rows = hung.exposition.rows if hung.exposition else []
    text = _plain(hung)
    assert "h:1  DOWN: no answer for 12s" in text
    assert _cells(text, "gpu:0")[-1] == "unreachable"


def test_text_that_is_not_an_exposition_is_an_error_naming_it() -> None:
    with pytest.raises(ScrapeError, match="not a Prometheus exposition"):
        parse_exposition('jaxmon_memory_bytes_in_use{device="0" 12\n', "h:1")


def test_urls_default_to_jaxmons_port_and_path_and_healthz_sits_at_the_root() -> None:
    assert metrics_url("gpu-node-3") == "http://gpu-node-3:10401/metrics"
    assert metrics_url("127.0.0.1:9000") == "http://127.0.0.1:9000/metrics"
    assert metrics_url("https://h:8443/custom/path") == "https://h:8443/custom/path"
    assert healthz_url("https://h:8443/custom/path") == "https://h:8443/healthz"
    assert display_name("https://h:8443/metrics") == "https://h:8443"
    assert display_name("http://h:1/metrics") == "h:1"


def test_bad_arguments_exit_2_naming_what_is_wrong(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def run(*args: str) -> tuple[int, str]:
        try:
            code = top_main(list(args))
        except SystemExit as exc:  # argparse's own errors
            code = int(exc.code or 0)
        return code, capsys.readouterr().err

    for args, message in (
        (["ftp://h/metrics"], "'ftp://h/metrics': scheme must be http or https, not 'ftp'"),
        (["--ca-file", str(tmp_path / "missing.pem")], f"--ca-file {tmp_path / 'missing.pem'}: no such file"),
        (["--password-file", str(SHAPES)], "--password-file needs --user"),
        (["--interval", "soon"], "argument --interval: not a duration: 'soon'"),
        (["--timeout", "0"], "argument --timeout: must be positive, got '0'"),
    ):
        code, err = run(*args, "--once")
        assert code == 2, args
        assert message in err
    code, err = run("127.0.0.1:1")  # the live view, with pytest's stdin: not a terminal
    assert code == 2
    assert "stdin and stdout must be a terminal for the live view; use --once" in err


RESERVED = """\
# TYPE jaxmon_memory_bytes_in_use gauge
jaxmon_memory_bytes_in_use{device="0",platform="tpu"} 13000000000
jaxmon_memory_bytes_in_use{device="1",platform="tpu"} 4000000000
# TYPE jaxmon_memory_limit_bytes gauge
jaxmon_memory_limit_bytes{device="0",platform="tpu"} 16000000000
jaxmon_memory_limit_bytes{device="1",platform="tpu"} 16000000000
# TYPE jaxmon_memory_reserved_bytes gauge
jaxmon_memory_reserved_bytes{device="0",platform="tpu"} 2500000000
jaxmon_memory_reserved_bytes{device="1",platform="tpu"} 0
# TYPE jaxmon_memory_free_bytes gauge
jaxmon_memory_free_bytes{device="0",platform="tpu"} 500000000
jaxmon_memory_free_bytes{device="1",platform="tpu"} 12000000000
"""


def test_a_tpu_with_reservations_shows_them_and_its_bar_counts_them() -> None:
    """16 GB limit, 13 GB in use and 2.5 GB reserved: the bar is 97 % full (in use alone would be 81 %)."""
    text = _plain(_state(RESERVED))
    header = next(line.split() for line in text.splitlines() if line.startswith("ENDPOINT"))
    assert header[2:6] == ["MEMORY", "in", "use/limit", "RESERVED"]
    assert _cells(text, "tpu:0")[2:6] == ["##########", "12.1GiB/14.9GiB", "2.3GiB", "476.8MiB"]
    assert _cells(text, "tpu:1")[2:6] == ["##........", "3.7GiB/14.9GiB", "0B", "11.2GiB"]
    rows = parse_exposition(RESERVED, "h:1").rows
    assert [r.used_ratio for r in rows] == [pytest.approx(15.5 / 16), pytest.approx(4 / 16)]


def test_the_reserved_column_is_absent_where_no_device_reports_reservations() -> None:
    assert "RESERVED" not in _plain(_state(EXPOSITION))
