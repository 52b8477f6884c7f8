"""docs/training.md's Flax NNX + Optax loop and its MaxText-style loop, run as written (tests/workloads/flax_loop.py
and maxtext_loop.py, whose marked regions the doc shows: tests/unit/test_docs_snippets.py) in real child processes
under jaxmon.start(), scraped over HTTP: every step counted, the tokens and model FLOPs as each process's share of the
job's, XLA's FLOPs of the MaxText-style step as its cost analysis reads them in the loop's own mesh context (where
the step lowers at all), and no tracking problem; and the PromQL the page shows parses."""

from __future__ import annotations

import re
import socket
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.helpers import Child, per_device, promtool, sample, wait_for_samples

ROOT = Path(__file__).resolve().parents[2]
WORKLOADS = ROOT / "tests" / "workloads"
ENV = {
    "JAXMON_WEB__LISTEN_ADDRESS": "127.0.0.1:0",
    "JAXMON_POLL__INTERVAL": "0.2",
    "JAXMON_COLLECTOR__PROBE__ENABLED": "false",
    "JAXMON_COLLECTOR__TRAINING__PEAK_FLOPS": "1e11",  # CPU has no peak in the table: MFU and HFU need one
}


def labels(workload: str) -> dict[str, str]:
    return {"workload": workload, "process_index": "0", "process_count": "1", "host": socket.gethostname()}


def problems(s: dict[tuple[str, frozenset[tuple[str, str]]], float]) -> dict[str, float]:
    return {dict(k[1])["reason"]: v for k, v in s.items() if k[0] == "jaxmon_training_tracking_problems_total" and v}


def test_the_flax_nnx_loop_of_the_docs_reports_every_step(children: list[Child], tmp_path: Path) -> None:
    child = Child(tmp_path, script=WORKLOADS / "flax_loop.py", env=ENV)
    children.append(child)
    done = child.hello
    steps, tokens = done["steps"], done["batch"] * done["seq"]
    lab = labels("flax-lm")
    s = wait_for_samples(
        done["url"], lambda s: sample(s, "jaxmon_training_steps_total", **lab) == steps, "the loop's steps"
    )
    assert sample(s, "jaxmon_training_step", **lab) == steps - 1
    assert sample(s, "jaxmon_training_examples_total", **lab) == steps * done["batch"]
    assert sample(s, "jaxmon_training_tokens_total", **lab) == steps * tokens
    assert problems(s) == {}
    # The step runs on one device: XLA's FLOPs there (nnx.jit tracked as is), the model FLOPs over every device.
    hardware = {d: v for d, v in per_device(s, "jaxmon_training_hardware_flops_total").items() if v}
    assert list(hardware.values()) == [pytest.approx(steps * done["flops"])], hardware
    model = per_device(s, "jaxmon_training_model_flops_total")
    assert len(model) == 8 and sum(model.values()) == pytest.approx(steps * 6 * done["n_params"] * tokens)
    assert per_device(s, "jaxmon_training_hardware_flops_utilization_ratio")  # a peak given: HFU is exported


def test_the_maxtext_style_loop_of_the_docs_reads_xla_flops_in_its_mesh(children: list[Child], tmp_path: Path) -> None:
    # Two CPU devices, a 1 x 2 mesh. On the suite's 2-core machines XLA:CPU runs every device's program on a pool of
    # about as many threads as cores; a collective's participants that wait in its rendezvous hold their threads, so
    # with more devices than threads and many steps in flight a rendezvous can wait for ever for a participant that
    # never gets a thread (with or without jaxmon). Eight devices did so now and then; four did once, beside two CPU
    # burners. Two devices are one rendezvous group, which two threads always complete.
    child = Child(tmp_path, script=WORKLOADS / "maxtext_loop.py", env={**ENV, "JAX_NUM_CPU_DEVICES": "2"})
    children.append(child)
    done = child.hello
    steps, tokens = done["steps"], done["batch"] * done["seq"]
    lab = labels("maxtext-style")
    s = wait_for_samples(
        done["url"], lambda s: sample(s, "jaxmon_training_steps_total", **lab) == steps, "the loop's steps"
    )
    assert sample(s, "jaxmon_training_examples_total", **lab) == steps * done["batch"]
    assert sample(s, "jaxmon_training_tokens_total", **lab) == steps * tokens
    # The step constrains shardings with bare PartitionSpecs: it lowers only in the loop's mesh context, and
    # jaxmon.track() read its cost there (no "cost" problem), the same FLOPs on every device of the mesh.
    assert done["lowers_outside_mesh"] is False
    assert problems(s) == {}
    hardware = per_device(s, "jaxmon_training_hardware_flops_total")
    assert len(hardware) == 2 and all(v == pytest.approx(steps * done["flops"]) for v in hardware.values()), hardware
    model = per_device(s, "jaxmon_training_model_flops_total")
    assert all(v == pytest.approx(steps * 6 * done["n_params"] * tokens / 2) for v in model.values()), model
    mfu = per_device(s, "jaxmon_training_model_flops_utilization_ratio")
    assert len(mfu) == 2 and all(v > 0 for v in mfu.values()), mfu
    # Goodput's accounting holds to the scrape: productive plus every kind of badput is start to last step (the
    # timestamps are the wall clock's at each event: NTP's slew of it since the start, parts per million, is in them).
    badput = sum(v for k, v in s.items() if k[0] == "jaxmon_training_badput_seconds_total")
    productive = sample(s, "jaxmon_training_productive_seconds_total", **lab)
    last = sample(s, "jaxmon_training_last_step_timestamp_seconds", **lab)
    start = sample(s, "jaxmon_training_start_time_seconds", **lab)
    assert productive is not None and last is not None and start is not None
    assert productive + badput == pytest.approx(last - start, rel=1e-3, abs=1e-4)


def test_the_promql_of_training_md_parses(tmp_path: Path) -> None:
    text = (ROOT / "docs" / "training.md").read_text()
    blocks = re.findall(r"^```promql\n(.*?)^```$", text, re.MULTILINE | re.DOTALL)
    assert len(blocks) == 3
    rules = [{"record": f"docs:block{n}", "expr": block} for n, block in enumerate(blocks)]
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "docs", "rules": rules}]}))
    out = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
