"""Daemon CPU of one NVML poll of 8 GPUs, against the fake libnvidia-ml.so.1 of the tests (no GPU here).

    .venv/bin/python bench/nvml_poll.py                    # this tree alone, about 40 seconds; needs gcc
    .venv/bin/python bench/nvml_poll.py --before 838cd00   # and an older tree's jaxmon/, rounds alternating
    .venv/bin/python bench/nvml_poll.py --gpm              # this tree, --collector.nvml.gpm false vs auto

A child process loads the fake through LD_LIBRARY_PATH exactly as the daemon does, builds the nvml collector and
runs `update()` POLLS times (after WARMUP polls) on 8 plausible H200s (tests/fakenvml's defaults: 18 active NVLink
links, no fans, MIG off; two processes each, each with a per-process utilization sample at every poll; GPM
supported). Polls are PAUSE apart (past GPM's 100 ms floor, so
that every poll takes a GPM sample and asks for its metrics, as at any real poll interval). The figure is the
process's CPU time over each `update()` (`time.process_time()`): the GPUs are read on reader threads, so the
polling thread's own CPU (`poll_thread_cpu_ms`, what this bench reported before the readers existed) leaves the
reads out; median and p99 per poll. The Xid thread, in the fake's blocking wait meanwhile, adds nearly nothing.
Also timed: rendering the families of that state (what a scrape costs for these 8 GPUs).

With `--before REF`, `git archive REF jaxmon` is unpacked into a temporary directory and the same child runs that
package (its directory comes first on the child's path), against the same fake and scenario: rounds alternate
(before, after, after, before, ...) so that the machine's load falls on both sides alike, and each side's figure is
over all its rounds' polls. `--gpm` does the same with this tree on both sides, `--collector.nvml.gpm false` against
`auto` (each GPU's GPM sample and one nvmlGpmMetricsGet of 12 metrics per poll). The fake does a stat() of its
scenario file per call, which a real driver does not, and it answers from memory where a driver goes to the kernel
(and samples PCIe throughput for 20 ms per call, which the fake does not emulate here; nor does it compute GPM
counters): the figure bounds jaxmon's Python side, not the driver's.
Target: <= 5 ms per poll.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import ROOT, median, run_code, save

sys.path.insert(0, str(ROOT))

from tests.fakenvml import Scenario, build, device

GPUS = 8
POLLS = 300
WARMUP = 20
ROUNDS = 6  # per side, with --before or --gpm
PAUSE = 0.11  # seconds between polls: past GPM's 100 ms floor

CHILD = """
import json, statistics, sys, time
import jaxmon
from jaxmon.collectors.base import standalone_context
from jaxmon.snapshot import Snapshot
from jaxmon.collectors.nvml import NvmlCollector, NvmlOptions

collector = NvmlCollector(NvmlOptions(**OPTIONS), standalone_context(None))
polls, walls, renders, threads = [], [], [], []
for i in range(WARMUP + POLLS):
    time.sleep(PAUSE)
    t0, w0, p0 = time.thread_time(), time.perf_counter(), time.process_time()
    update = collector.update()
    t1, w1, p1 = time.thread_time(), time.perf_counter(), time.process_time()
    assert update.success and len(update.state.gpus) == GPUS, update
    if i >= WARMUP:
        # GPM on: every poll has each GPU's values over the interval since the previous one.
        assert all((g.gpm is not None) == (OPTIONS.get("gpm") is not False) for g in update.state.gpus), update
        polls.append(p1 - p0)
        threads.append(t1 - t0)
        walls.append(w1 - w0)
        r0 = time.thread_time()
        families = [f for f in collector.families(Snapshot(), update.state) if f.samples]
        renders.append(time.thread_time() - r0)
series = sum(len(f.samples) for f in families)
collector.stop()
print(json.dumps({"cpu": polls, "thread": threads, "wall": walls, "render": renders, "series": series,
                  "jaxmon": jaxmon.__file__}))
"""


def run_child(
    scenario: Scenario, polls: int, tree: Path | None, options: dict[str, Any] | None = None
) -> dict[str, Any]:
    """One child's polls, from this checkout's jaxmon or from `tree`'s, with these NvmlOptions."""
    code = CHILD.replace("WARMUP", str(WARMUP)).replace("POLLS", str(polls)).replace("GPUS", str(GPUS))
    code = code.replace("PAUSE", str(PAUSE)).replace("OPTIONS", repr(options or {}))
    return run_code(code, scenario.env(), tree)


def summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    cpu = sorted(x for r in rounds for x in r["cpu"])
    wall = sorted(x for r in rounds for x in r["wall"])
    render = sorted(x for r in rounds for x in r["render"])
    thread = sorted(x for r in rounds for x in r["thread"])
    return {
        "polls": len(cpu),
        "poll_cpu_ms": {
            "median": median(cpu) * 1e3,
            "p99": cpu[int(0.99 * len(cpu))] * 1e3,
            "mean": statistics.fmean(cpu) * 1e3,
            "round_medians": [median(r["cpu"]) * 1e3 for r in rounds],
        },
        "poll_thread_cpu_ms": {"median": median(thread) * 1e3, "p99": thread[int(0.99 * len(thread))] * 1e3},
        "poll_wall_ms": {"median": median(wall) * 1e3, "p99": wall[int(0.99 * len(wall))] * 1e3},
        "render_cpu_ms": {"median": median(render) * 1e3},
        "series": rounds[0]["series"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", help="a git revision whose jaxmon/ to time beside this tree's, alternating")
    parser.add_argument("--gpm", action="store_true", help="time --collector.nvml.gpm false against auto, alternating")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        # Two processes per GPU, each sampled busy since every poll (one per-process utilization sample each).
        busy = {"sm": 40, "memory": 10, "encoder": 0, "decoder": 0}
        processes = [
            {"pid": 1000, "used": 1 << 30, "utilization": busy},
            {"pid": 2000, "used": 2 << 30, "utilization": busy},
        ]
        devices = [device(i, processes=[{**p, "pid": p["pid"] + i} for p in processes]) for i in range(GPUS)]
        scenario = Scenario(Path(tmp) / "scenario.json", devices)
        build()
        started = time.time()
        if args.gpm:
            per_round = POLLS // ROUNDS
            modes: dict[str, list[dict[str, Any]]] = {"gpm_off": [], "gpm_on": []}
            for k in range(ROUNDS):
                for mode in (("gpm_off", "gpm_on"), ("gpm_on", "gpm_off"))[k % 2]:
                    options = {"gpm": False} if mode == "gpm_off" else {}
                    modes[mode].append(run_child(scenario, per_round, None, options))
            off, on = summary(modes["gpm_off"]), summary(modes["gpm_on"])
            result: dict[str, Any] = {
                "gpus": GPUS,
                "rounds_per_side": ROUNDS,
                "gpm_off": off,
                "gpm_on": on,
                "delta_median_ms": on["poll_cpu_ms"]["median"] - off["poll_cpu_ms"]["median"],
            }
        elif args.before is None:
            result = {"gpus": GPUS, **summary([run_child(scenario, POLLS, None)])}
        else:
            before_tree = Path(tmp) / "before"
            before_tree.mkdir()
            archive = subprocess.run(
                ["git", "archive", args.before, "jaxmon"], cwd=ROOT, capture_output=True, check=True
            ).stdout
            subprocess.run(["tar", "-x", "-C", str(before_tree)], input=archive, check=True)
            per_round = POLLS // ROUNDS
            sides: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
            order = [("before", "after"), ("after", "before")]
            for k in range(ROUNDS):
                for side in order[k % 2]:
                    tree = before_tree if side == "before" else None
                    sides[side].append(run_child(scenario, per_round, tree))
            result = {
                "gpus": GPUS,
                "before_revision": args.before,
                "rounds_per_side": ROUNDS,
                "before": summary(sides["before"]),
                "after": summary(sides["after"]),
            }
        result.update({"target_ms": 5.0, "started": started})
    save("nvml_poll", result)


if __name__ == "__main__":
    main()
