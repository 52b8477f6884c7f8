"""Training telemetry end to end: a real trainer process calling jaxmon.step(), embedded and through the spool to a
sidecar, checked against the trainer's own completion times and XLA's cost analysis, and promtool-clean."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests

from jaxmon.births import BADPUT_KINDS, PROBLEM_REASONS
from tests.conftest import ROOT, Samples, StartDaemon, promtool, sample
from tests.helpers import AS_PROMETHEUS, Child, parse_samples, wait_for_fresh_samples, wait_for_samples

PEAK = 1e11
# What a pod spec's Downward API (and Slurm) put in the trainer's environment.
SCHEDULER = {"POD_NAME": "llama-0-abc", "POD_NAMESPACE": "research", "NODE_NAME": "gpu-node-7", "SLURM_JOB_ID": "4242"}
SCHEDULER_LABELS = {"pod": "llama-0-abc", "namespace": "research", "node": "gpu-node-7", "slurm_job_id": "4242"}
STEPS = 10
DATA_MS = 20
# The series one training process adds (docs/training.md, "Series per process"): at most 82 (9 counters and gauges,
# the step histogram's 21, jaxmon_workload_info, 18 kinds of badput, 12 reasons of tracking problems, 4 results of
# sampled traces, the loss gauge's 16 names and its step) + 12 per local device (model and hardware FLOPs, bytes
# accessed, peak, MFU, HFU, the programs' predicted peak memory; the sampled traces' 4 parts and profiled seconds,
# at 0 from start where sampling is on: born at zero) + 1 per local device and (op, axes) pair the tracked programs'
# collectives use, before the first sampled trace (which adds its collective ops).
TRAINING_FAMILIES = ("jaxmon_training_", "jaxmon_device_peak_flops_per_second", "jaxmon_workload_info")


def training_series_budget(devices: int, collective_pairs: int = 0) -> int:
    return 82 + (12 + collective_pairs) * devices


def _check_against_the_loop(s: Samples, answer: dict[str, Any], **labels: str) -> None:
    """What the trainer's loop measured and computed itself, against what was exported."""
    done, flops, device = answer["done"], answer["flops"], str(answer["device"])
    # The process's identity, with where the scheduler put it, for group_left joins.
    info = [dict(k[1]) for k in s if k[0] == "jaxmon_workload_info" and ("workload", labels["workload"]) in k[1]]
    assert len(info) == 1 and SCHEDULER_LABELS.items() <= info[0].items(), info
    assert info[0]["host"] == labels["host"] and info[0]["process_index"] == "0"
    per_device = {**labels, "device": device, "platform": "cpu"}
    assert sample(s, "jaxmon_training_steps_total", **labels) == STEPS
    assert sample(s, "jaxmon_training_step", **labels) == STEPS - 1
    assert sample(s, "jaxmon_training_step_duration_seconds_count", **labels) == STEPS - 1
    total = sample(s, "jaxmon_training_step_duration_seconds_sum", **labels)
    assert total == pytest.approx(done[-1] - done[0], abs=0.02)
    assert sample(s, "jaxmon_training_examples_total", **labels) == 256 * STEPS
    assert sample(s, "jaxmon_training_tokens_total", **labels) == 2560 * STEPS
    assert sample(s, "jaxmon_training_hardware_flops_total", **per_device) == pytest.approx(STEPS * flops)
    # model_flops=8e6 per step for the whole job: 1e6 on each of the 8 devices.
    for d in range(8):
        assert sample(s, "jaxmon_training_model_flops_total", **{**per_device, "device": str(d)}) == 1e6 * STEPS
    assert sample(s, "jaxmon_device_peak_flops_per_second", **per_device, origin="setting") == PEAK
    # The window holds the 9 step intervals: their model FLOPs (the first step opens it) over their time less the
    # badput named in them: the data blocks after the first (charged to data in full, as the loop timed it, but for
    # the instants before the waiter saw the previous step complete, a thread switch or two).
    assert total is not None
    data = sample(s, "jaxmon_training_badput_seconds_total", **labels, kind="data")
    assert data is not None and data <= sum(answer["loads"]) + 1e-3
    counted = total - (data - answer["loads"][0])
    # Within 2 ms either way of a ~30 ms window (the first block's share, which the loop times from outside the
    # block, and a thread switch; 1.7 ms was seen on a quiet machine); with the data blocks left in (the old
    # denominator) it would be several times lower.
    mfu = sample(s, "jaxmon_training_model_flops_utilization_ratio", **per_device)
    assert mfu is not None
    assert (STEPS - 1) * 1e6 / ((counted + 0.002) * PEAK) <= mfu <= (STEPS - 1) * 1e6 / ((counted - 0.002) * PEAK)
    hfu = sample(s, "jaxmon_training_hardware_flops_utilization_ratio", **per_device)
    assert hfu == pytest.approx((STEPS - 1) * flops / (counted * PEAK), rel=0.05)
    # The blocks as the loop timed them (a loaded machine wakes a 20 ms sleep late: 0.236 s for 0.2 s was seen).
    assert data == pytest.approx(sum(answer["loads"]), abs=0.03) and sum(answer["loads"]) >= STEPS * DATA_MS / 1000
    productive = sample(s, "jaxmon_training_productive_seconds_total", **labels)
    assert productive is not None and 0 < productive < total
    # Productive time and every kind of badput are the time from jaxmon's start to the last completion, as the loop
    # timed it: its start lies between the loop's readings just before and just after jaxmon.start() or publish(),
    # and the waiter booked the last completion within a thread switch or two of the loop (more when loaded).
    badput = sum(v for (name, lbls), v in s.items() if name == "jaxmon_training_badput_seconds_total" and
                 labels.items() <= dict(lbls).items())  # fmt: skip
    (before, after), (unix_before, unix_after) = answer["started"]["monotonic"], answer["started"]["unix"]
    assert done[-1] - after - 0.02 <= productive + badput <= done[-1] - before + 0.02, (before, after, done[-1])
    # The timestamps are the wall clock's at the start and at the last completion, as the loop read it.
    start = sample(s, "jaxmon_training_start_time_seconds", **labels)
    last = sample(s, "jaxmon_training_last_step_timestamp_seconds", **labels)
    assert start is not None and last is not None
    assert unix_before - 0.001 <= start <= unix_after + 0.001, (unix_before, start, unix_after)
    assert last == pytest.approx(answer["done_unix"], abs=0.02)
    # And so they differ by the accounted time, within the wall clock's corrections since the start (NTP's slew:
    # parts per million; a step of the clock would be all in it).
    assert productive + badput == pytest.approx(last - start, abs=0.002)
    # The series it adds stay within the bound.
    series = [k for k in s if k[0].startswith(TRAINING_FAMILIES) and ("workload", labels["workload"]) in k[1]]
    utilization = {k for k in series if k[0] == "jaxmon_training_model_flops_utilization_ratio"}
    assert len(utilization) == 8 and len(series) <= training_series_budget(8), sorted(k[0] for k in series)


def _lint(text: str) -> None:
    check = subprocess.run([promtool(), "check", "metrics"], input=text, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


def test_an_embedded_trainer_exports_its_steps_flops_mfu_and_badput(children: list[Child], tmp_path: Path) -> None:
    child = Child(
        tmp_path, "embedded", "--workload", "toy", "--interval", "0.2", "--peak-flops", str(PEAK),
        env={"JAXMON_COLLECTOR__PROBE": "false", **SCHEDULER},
    )  # fmt: skip
    children.append(child)
    url = child.hello["url"]
    labels = {"workload": "toy", "process_index": "0", "process_count": "1", "host": socket.gethostname()}
    # No step() yet: the counters are born at zero (jaxmon.births), each built-in badput kind and problem reason.
    before = wait_for_samples(url, lambda s: ("jaxmon_training_steps_total", frozenset(labels.items())) in s, "born")
    assert sample(before, "jaxmon_training_steps_total", **labels) == 0
    assert sample(before, "jaxmon_training_tokens_total", **labels) == 0
    for kind in BADPUT_KINDS:
        assert sample(before, "jaxmon_training_badput_seconds_total", kind=kind, **labels) == 0, kind
    for reason in PROBLEM_REASONS:
        assert sample(before, "jaxmon_training_tracking_problems_total", reason=reason, **labels) == 0, reason
    answer = child.send(f"steps {STEPS} {DATA_MS}")
    wait_for_samples(url, lambda s: sample(s, "jaxmon_training_steps_total", **labels) == STEPS, "every step seen")
    # A series new in that scrape (the FLOPs of the step's device, first given by a step) reads 0 in the first scrape
    # that serves it (jaxmon.births): an update after it shows what it was held from.
    s = wait_for_fresh_samples(url, "training", "after every step was seen")
    _check_against_the_loop(s, answer, **labels)
    _lint(requests.get(url + "/metrics", timeout=10).text)
    # jaxmon top shows the workload's step, step time and MFU on the row of the device the step ran on.
    top = subprocess.run(
        [sys.executable, "-m", "jaxmon", "top", "--once", url], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    header = next(line for line in top.stdout.splitlines() if line.startswith("ENDPOINT"))
    assert "STEP" in header and "STEP TIME" in header and "MFU" in header, top.stdout
    (row,) = [line for line in top.stdout.splitlines() if f" cpu:{answer['device']} " in line]
    cells = row.split()
    assert str(STEPS - 1) in cells and any(c.endswith("%") for c in cells), row


def _loss(s: Samples, labels: dict[str, str]) -> float | None:
    """jaxmon_training_loss{name="loss"} of the process `labels` names (sample() takes `name` itself)."""
    return s.get(("jaxmon_training_loss", frozenset({**labels, "name": "loss"}.items())))


def _check_the_loss(s: Samples, labels: dict[str, str], handed: range) -> None:
    """The loss gauge and its step agree with the loop: the value is 1 / (step + 1) in float32 (the loop's loss)
    for the step `jaxmon_training_loss_step` names, one of the steps the loop handed a loss."""
    step = sample(s, "jaxmon_training_loss_step", **labels)
    assert step is not None and int(step) in handed, (step, handed)
    truth = float(np.float32(1.0) / np.float32(int(step) + 1))
    assert _loss(s, labels) == truth
    names = {dict(k[1]).get("name") for k in s if k[0] == "jaxmon_training_loss" and labels.items() <= k[1]}
    assert names == {"loss"}


def test_an_embedded_trainers_loss_is_the_loss_of_the_step_it_names(children: list[Child], tmp_path: Path) -> None:
    """jaxmon.step(n, loss) with a scalar array: scraped over HTTP, jaxmon_training_loss{name="loss"} is the loss
    of the step jaxmon_training_loss_step names (issue 42), absent before; jaxmon top shows it."""
    child = Child(
        tmp_path, "embedded", "--workload", "lossy", "--interval", "0.2",
        env={"JAXMON_COLLECTOR__PROBE": "false", **SCHEDULER},
    )  # fmt: skip
    children.append(child)
    url = child.hello["url"]
    labels = {"workload": "lossy", "process_index": "0", "process_count": "1", "host": socket.gethostname()}
    child.send("steps 2")  # steps with no loss (their ready is a vector): no loss series
    s = wait_for_samples(url, lambda s: sample(s, "jaxmon_training_steps_total", **labels) == 2, "2 steps")
    assert not [k for k in s if k[0].startswith("jaxmon_training_loss")]
    child.send("losses 5")
    s = wait_for_samples(url, lambda s: sample(s, "jaxmon_training_steps_total", **labels) == 7, "7 steps")
    s = wait_for_samples(url, lambda s: sample(s, "jaxmon_training_loss_step", **labels) is not None, "the loss")
    # The loop stopped: once it is still, the newest loss held is read (jaxmon.training.waiter): the gauge may move
    # once more, to a later step, and then stays.
    for _ in range(30):
        time.sleep(1.0)
        later = parse_samples(requests.get(url + "/metrics", timeout=10).text)
        if sample(later, "jaxmon_training_loss_step", **labels) == sample(s, "jaxmon_training_loss_step", **labels):
            break
        s = later
    _check_the_loss(s, labels, range(2, 7))
    _lint(requests.get(url + "/metrics", timeout=10).text)
    step = sample(s, "jaxmon_training_loss_step", **labels)
    assert step is not None
    top = subprocess.run(
        [sys.executable, "-m", "jaxmon", "top", "--once", url], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    header = next(line for line in top.stdout.splitlines() if line.startswith("ENDPOINT"))
    assert "LOSS" in header, top.stdout
    shown = f"{float(np.float32(1.0) / np.float32(int(step) + 1)):.4g}"
    assert any(f" {shown} " in line and "lossy" in line for line in top.stdout.splitlines()), (shown, top.stdout)


def test_a_publishing_trainers_steps_reach_the_sidecar(
    children: list[Child], tmp_path: Path, start_daemon: StartDaemon
) -> None:
    spool = tmp_path / "spool"
    child = Child(
        tmp_path, "publish", "--spool", str(spool), "--workload", "pub", "--interval", "0.2",
        "--peak-flops", str(PEAK), env={"JAXMON_COLLECTOR__PROBE": "false", **SCHEDULER},
    )  # fmt: skip
    children.append(child)
    d = start_daemon("--no-collector.probe", "--collector.spool.dir", str(spool), "--poll.interval", "0.2s")
    answer = child.send(f"steps {STEPS} {DATA_MS}")
    labels = {"workload": "pub", "process_index": "0", "process_count": "1", "host": socket.gethostname()}
    d.wait_for(lambda s: sample(s, "jaxmon_training_steps_total", **labels) == STEPS, what="the sidecar's steps")
    s = wait_for_fresh_samples(d.url, "spool", "after every step was seen")  # a new series' first scrape reads 0
    _check_against_the_loop(s, answer, **labels)
    _lint(d.get("/metrics").text)
    # The loss crosses the spool as read: the sidecar's gauge is the loss of the step its loss_step names.
    child.send("losses 3")
    s = d.wait_for(lambda s: _loss(s, labels) is not None, what="the loss")
    _check_the_loss(s, labels, range(STEPS, STEPS + 3))
    assert child.send("exit") == {"stopped": True}
    # The trainer's clean exit removes its file: its training series go with it at the next poll.
    d.wait_for(lambda s: sample(s, "jaxmon_training_steps_total", **labels) is None, what="the workload gone")
    # Born at zero on the sidecar: a process it has not served yet (here a new trainer of the same name, stepping
    # before a new sidecar reads it) reads 0 in its first exposition, every counter, then all of its steps.
    again = Child(
        tmp_path, "publish", "--spool", str(spool), "--workload", "pub", "--interval", "0.2",
        env={"JAXMON_COLLECTOR__PROBE": "false", **SCHEDULER},
    )  # fmt: skip
    children.append(again)
    again.send(f"steps {STEPS} {DATA_MS}")
    time.sleep(0.5)  # its document with every step written
    d2 = start_daemon(
        "--no-collector.probe", "--collector.spool.dir", str(spool), "--poll.interval", "0.2s", client=AS_PROMETHEUS
    )  # as Prometheus: served the held 0 (another reader is served the values)
    first = d2.wait_for(lambda s: sample(s, "jaxmon_training_steps_total", **labels) is not None, what="it, held")
    for name in ("jaxmon_training_steps_total", "jaxmon_training_productive_seconds_total"):
        assert sample(first, name, **labels) == 0, name
    assert sample(first, "jaxmon_training_badput_seconds_total", kind="startup", **labels) == 0
    ident = {"workload": "pub", "process_index": "0"}
    assert sample(first, "jaxmon_jit_compilations_total", **ident) == 0
    later = d2.wait_for(lambda s: sample(s, "jaxmon_training_steps_total", **labels) == STEPS, what="then counted")
    assert (sample(later, "jaxmon_training_badput_seconds_total", kind="startup", **labels) or 0) > 0
    assert (sample(later, "jaxmon_jit_compilations_total", **ident) or 0) > 0


def test_a_badput_kind_not_declared_is_born_at_zero_at_its_first_open(children: list[Child], tmp_path: Path) -> None:
    """`eval` is declared (at 0 from the start); `mykind` and `quick` are not. Each is exported from its first open
    at 0, and counts its seconds only once a scrape served that 0: Prometheus sees all of it in `increase()`. A
    long block (open over several scrapes) reads 0 while open and its seconds once closed and booked; a short one
    (closed and booked before any scrape saw it) is served at 0 once, then its seconds."""
    child = Child(
        tmp_path, "embedded", "--workload", "kinds", "--interval", "0.1",
        env={"JAXMON_COLLECTOR__PROBE": "false", "JAXMON_COLLECTOR__TRAINING__BADPUT_KINDS": '["eval"]'},
    )  # fmt: skip
    children.append(child)
    url = child.hello["url"]
    labels = {"workload": "kinds", "process_index": "0", "process_count": "1", "host": socket.gethostname()}

    def seconds(s: Samples, kind: str) -> float | None:
        return sample(s, "jaxmon_training_badput_seconds_total", kind=kind, **labels)

    child.send("steps 3")
    # Scraping as Prometheus does: served the held 0 (another reader is served the values).
    s = wait_for_samples(
        url, lambda s: sample(s, "jaxmon_training_steps_total", **labels) == 3, "3 steps", client=AS_PROMETHEUS
    )
    assert seconds(s, "eval") == 0 and seconds(s, "mykind") is None and seconds(s, "quick") is None
    child.send("hold mykind")
    opened = [
        wait_for_samples(
            url, lambda s: seconds(s, "mykind") is not None, "mykind born at its open", client=AS_PROMETHEUS
        )
    ]
    for _ in range(5):  # every scrape while it is open: 0
        opened.append(wait_for_samples(url, lambda s: True, client=AS_PROMETHEUS))
    assert [seconds(s, "mykind") for s in opened] == [0.0] * 6
    held = child.send("release")["seconds"]
    child.send("steps 1")  # its completion books the block
    s = wait_for_samples(url, lambda s: (seconds(s, "mykind") or 0) > 0, "mykind's seconds", client=AS_PROMETHEUS)
    # The device was idle through the block (the loop synced and jaxmon booked the step before it opened).
    assert seconds(s, "mykind") == pytest.approx(held, abs=0.02)
    # A block that opens, closes and is booked between two scrapes: the first scrape that has it serves 0.
    child.send("hold quick")
    quick = child.send("release")["seconds"]
    child.send("steps 1")
    first = wait_for_samples(url, lambda s: seconds(s, "quick") is not None, "quick born", client=AS_PROMETHEUS)
    assert seconds(first, "quick") == 0.0
    later = wait_for_samples(
        url, lambda s: (seconds(s, "quick") or 0) > 0, "quick's seconds after one scrape", client=AS_PROMETHEUS
    )
    assert seconds(later, "quick") == pytest.approx(quick, abs=0.02)
    assert seconds(later, "mykind") == seconds(s, "mykind")


def test_openmetrics_scrapes_get_created_on_training_counters(children: list[Child], tmp_path: Path) -> None:
    """A scraper that asks for OpenMetrics (as Prometheus does) gets it, parsed by client_python's strict parser:
    each training counter's and the step histogram's label sets carry `_created`, the process's tracker start
    (`jaxmon_training_start_time_seconds`), as client_python writes it for its own counters. The text format
    (0.0.4) has no `_created` (tests/golden pin it)."""
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    child = Child(
        tmp_path, "embedded", "--workload", "om", "--interval", "0.1", env={"JAXMON_COLLECTOR__PROBE": "false"}
    )
    children.append(child)
    url = child.hello["url"]
    labels = {"workload": "om", "process_index": "0", "process_count": "1", "host": socket.gethostname()}
    child.send("steps 3 5")
    text = wait_for_samples(url, lambda s: sample(s, "jaxmon_training_steps_total", **labels) == 3, "3 steps")
    start = sample(text, "jaxmon_training_start_time_seconds", **labels)
    assert start is not None and start > 0
    assert not any(name.endswith("_created") for name, _ in text)
    plain = requests.get(url + "/metrics", timeout=10)
    assert plain.headers["content-type"].startswith("text/plain; version=0.0.4") and "_created" not in plain.text
    for encoding in ("identity", "gzip"):
        r = requests.get(
            url + "/metrics",
            headers={
                "Accept": "application/openmetrics-text;version=1.0.0,text/plain;q=0.5",
                "Accept-Encoding": encoding,
            },
            timeout=10,
        )
        assert r.status_code == 200
        assert r.headers["content-type"] == "application/openmetrics-text; version=1.0.0; charset=utf-8"
        assert r.text.endswith("# EOF\n") and r.text.count("# EOF") == 1
        families = {f.name: f for f in text_string_to_metric_families(r.text)}  # type: ignore[no-untyped-call]
        checked = 0
        for name, family in families.items():
            if not name.startswith("jaxmon_training_") or family.type not in ("counter", "histogram"):
                continue
            sets = {frozenset((k, v) for k, v in s.labels.items() if k != "le") for s in family.samples}
            created = {frozenset(s.labels.items()): s.value for s in family.samples if s.name == name + "_created"}
            assert set(created) == sets and set(created.values()) == {start}, name
            checked += 1
        assert checked >= 10 and "jaxmon_training_step_duration_seconds" in families
        # Counters that are not a training process's carry none: they count from the exporter's start.
        compilations = families["jaxmon_jit_compilations"]
        assert compilations.type == "counter" and all(not s.name.endswith("_created") for s in compilations.samples)
