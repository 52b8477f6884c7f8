"""`jaxmon top`'s training columns from literal expositions: the step, the recent step time and MFU per device."""

from __future__ import annotations

import io

from rich.console import Console

from jaxmon.top.rows import parse_exposition, recent_step_times
from jaxmon.top.view import ASCII, fmt_seconds, table

EXPOSITION = """\
jaxmon_device_info{device="0",device_kind="cpu",platform="cpu",process_index="0",source="spool",workload="llama"} 1
jaxmon_device_info{device="1",device_kind="cpu",platform="cpu",process_index="1",source="spool",workload="llama"} 1
jaxmon_device_info{device="0",device_kind="cpu",platform="cpu",process_index="0",source="spool",workload="idle"} 1
jaxmon_memory_live_array_bytes{device="0",platform="cpu",workload="llama"} 1024
jaxmon_memory_live_array_bytes{device="1",platform="cpu",workload="llama"} 1024
jaxmon_memory_live_array_bytes{device="0",platform="cpu",workload="idle"} 1024
jaxmon_training_step{process_index="0",workload="llama"} 41
jaxmon_training_step{process_index="1",workload="llama"} 40
jaxmon_training_step_duration_seconds_sum{process_index="0",workload="llama"} {sum0}
jaxmon_training_step_duration_seconds_count{process_index="0",workload="llama"} {count0}
jaxmon_training_step_duration_seconds_sum{process_index="1",workload="llama"} 4.0
jaxmon_training_step_duration_seconds_count{process_index="1",workload="llama"} 40
jaxmon_training_model_flops_utilization_ratio{device="0",platform="cpu",process_index="0",workload="llama"} 0.375
"""


def _scrape(sum0: float, count0: int) -> str:
    return EXPOSITION.replace("{sum0}", str(sum0)).replace("{count0}", str(count0))


def test_each_row_gets_its_own_processs_step_and_its_devices_mfu() -> None:
    rows = {(r.key.workload, r.key.device): r for r in parse_exposition(_scrape(8.0, 40), "h:1").rows}
    llama0, llama1, idle = rows[("llama", "0")], rows[("llama", "1")], rows[("idle", "0")]
    assert (llama0.step, llama0.step_time, llama0.mfu) == (41, 0.2, 0.375)
    assert (llama1.step, llama1.step_time, llama1.mfu) == (40, 0.1, None)  # process 1: its own step and time
    assert (idle.step, idle.step_time, idle.mfu) == (None, None, None)  # no jaxmon.step() there: dashes


def test_the_step_time_is_that_of_the_steps_since_the_previous_scrape() -> None:
    old = parse_exposition(_scrape(8.0, 40), "h:1")
    new = parse_exposition(_scrape(9.5, 43), "h:1")  # 3 more steps took 1.5 s: 0.5 s each (mean since start 0.22)
    recent_step_times(new, old)
    llama0 = next(r for r in new.rows if (r.key.workload, r.key.device) == ("llama", "0"))
    assert llama0.step_time == 0.5
    same = parse_exposition(_scrape(9.5, 43), "h:1")
    recent_step_times(same, new)  # no step since: the mean since start stays
    assert next(r for r in same.rows if r.key.device == "0" and r.key.workload == "llama").step_time == 9.5 / 43


def test_the_training_columns_show_only_where_a_workload_steps() -> None:
    buffer = io.StringIO()
    console = Console(file=buffer, width=300, force_terminal=False, no_color=True)
    console.print(table(parse_exposition(_scrape(8.0, 40), "h:1").rows, "device", ASCII))
    text = buffer.getvalue()
    assert "STEP" in text and "STEP TIME" in text and "MFU" in text
    llama0 = next(line for line in text.splitlines() if "llama" in line and "cpu:0" in line)
    assert "41" in llama0 and "200.0ms" in llama0 and "37.5%" in llama0
    buffer = io.StringIO()
    Console(file=buffer, width=300, no_color=True).print(
        table(parse_exposition('jaxmon_device_up{device="0",platform="cpu"} 1\n', "h:1").rows, "device", ASCII)
    )
    assert "STEP" not in buffer.getvalue() and "MFU" not in buffer.getvalue()
    assert [fmt_seconds(v) for v in (0.0005, 0.0123, 1.25, 185)] == ["500us", "12.3ms", "1.25s", "3m05s"]


GOODPUT = """\
jaxmon_device_info{device="0",device_kind="cpu",platform="cpu",process_index="0",source="spool",workload="gpt"} 1
jaxmon_memory_live_array_bytes{device="0",platform="cpu",workload="gpt"} 1024
jaxmon_training_step{process_index="0",workload="gpt"} 9
jaxmon_training_productive_seconds_total{process_index="0",workload="gpt"} {productive}
jaxmon_training_badput_seconds_total{kind="startup",process_index="0",workload="gpt"} 2.0
jaxmon_training_badput_seconds_total{kind="compile",process_index="0",workload="gpt"} 3.0
jaxmon_training_badput_seconds_total{kind="eval",process_index="0",workload="gpt"} {eval}
jaxmon_training_tokens_total{process_index="0",workload="gpt"} {tokens}
"""


def _gpt(productive: float, eval_seconds: float, tokens: float) -> str:
    text = GOODPUT.replace("{productive}", str(productive)).replace("{eval}", str(eval_seconds))
    return text.replace("{tokens}", str(tokens))


def test_goodput_tokens_per_second_and_the_largest_badput_kind() -> None:
    # Since start: 15 productive seconds of 15 + 2 + 3 + 0 = 20: 75 %; 40 000 tokens in 20 s; compile 15 %.
    old = parse_exposition(_gpt(15.0, 0.0, 40_000), "h:1")
    (row,) = old.rows
    assert row.goodput == 0.75 and row.tokens_per_second == 2000 and row.top_badput == ("compile", 0.15)
    # Since the previous scrape: 8 s more productive and 2 s of eval: 80 %, 30 000 tokens in 10 s, eval 20 %.
    new = parse_exposition(_gpt(23.0, 2.0, 70_000), "h:1")
    recent_step_times(new, old)
    (row,) = new.rows
    assert row.goodput == 0.8 and row.tokens_per_second == 3000 and row.top_badput == ("eval", 0.2)
    buffer = io.StringIO()
    Console(file=buffer, width=300, force_terminal=False, no_color=True).print(table(new.rows, "device", ASCII))
    text = buffer.getvalue()
    assert "GOODPUT" in text and "TOKENS/S" in text and "BADPUT" in text
    line = next(line for line in text.splitlines() if "gpt" in line)
    assert "80.0%" in line and "3.0k" in line and "eval 20.0%" in line
    # A restarted process (its counters began again): the numbers since its start.
    restarted = parse_exposition(_gpt(1.0, 0.0, 1000), "h:1")
    recent_step_times(restarted, new)
    (row,) = restarted.rows
    assert row.goodput == 1.0 / 6.0 and row.top_badput == ("compile", 0.5)


def test_identical_cpu_device_rows_are_one_row() -> None:
    """8 virtual CPU devices of one host holding the same: one row `cpu:0-7`, but for the one that differs; GPUs
    that read alike stay a row each."""
    lines = [
        f'jaxmon_memory_live_array_bytes{{device="{d}",platform="cpu",workload="w"}} {2048 if d == 5 else 1024}'
        for d in range(8)
    ]
    lines += [f'jaxmon_memory_bytes_in_use{{device="{d}",platform="gpu"}} 1024' for d in range(2)]
    buffer = io.StringIO()
    rows = parse_exposition("\n".join(lines) + "\n", "h:1").rows
    Console(file=buffer, width=300, force_terminal=False, no_color=True).print(table(rows, "device", ASCII))
    text = buffer.getvalue()
    assert "cpu:0-4,6-7" in text and "cpu:5 " in text
    assert sum("cpu:" in line for line in text.splitlines()) == 2
    assert "gpu:0" in text and "gpu:1" in text


LOSS = """\
jaxmon_device_info{device="0",device_kind="cpu",platform="cpu",process_index="0",source="spool",workload="gpt"} 1
jaxmon_device_info{device="1",device_kind="cpu",platform="cpu",process_index="1",source="spool",workload="gpt"} 1
jaxmon_device_info{device="2",device_kind="cpu",platform="cpu",process_index="2",source="spool",workload="gpt"} 1
jaxmon_device_info{device="0",device_kind="cpu",platform="cpu",process_index="0",source="spool",workload="idle"} 1
jaxmon_training_step{process_index="0",workload="gpt"} 9
jaxmon_training_step{process_index="1",workload="gpt"} 9
jaxmon_training_step{process_index="2",workload="gpt"} 9
jaxmon_training_loss{name="acc",process_index="0",workload="gpt"} 0.5
jaxmon_training_loss{name="loss",process_index="0",workload="gpt"} 2.718281828
jaxmon_training_loss{name="grad_norm",process_index="1",workload="gpt"} 123456.0
jaxmon_training_loss{name="z",process_index="1",workload="gpt"} 1.0
jaxmon_training_loss{name="loss",process_index="2",workload="gpt"} NaN
jaxmon_training_loss_step{process_index="0",workload="gpt"} 8
"""


def test_the_loss_column_shows_each_processs_loss_to_four_significant_digits() -> None:
    """The value named `loss` where there is one, else the first name's; NaN as it is; a dash with no loss."""
    rows = {(r.key.workload, r.key.device): r for r in parse_exposition(LOSS, "h:1").rows}
    assert rows[("gpt", "0")].loss == 2.718281828
    assert rows[("gpt", "1")].loss == 123456.0  # grad_norm sorts before z
    assert rows[("idle", "0")].loss is None
    buffer = io.StringIO()
    Console(file=buffer, width=300, force_terminal=False, no_color=True).print(
        table(list(rows.values()), "device", ASCII)
    )
    text = buffer.getvalue()
    assert "LOSS" in text.splitlines()[0]
    lines = {d: next(line for line in text.splitlines() if "gpt" in line and f"cpu:{d}" in line) for d in "012"}
    assert " 2.718 " in lines["0"] and " 1.235e+05 " in lines["1"] and " nan " in lines["2"]
    idle = next(line for line in text.splitlines() if "idle" in line)
    assert "2.718" not in idle
    buffer = io.StringIO()
    Console(file=buffer, width=300, no_color=True).print(
        table(parse_exposition(_scrape(8.0, 40), "h:1").rows, "device", ASCII)
    )
    assert "LOSS" not in buffer.getvalue()  # no loss anywhere: no column
