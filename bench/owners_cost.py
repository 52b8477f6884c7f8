"""Node mode's render with pod labels: what the owner transform (issue 35) costs, before and after, on 8 GPUs.

    .venv/bin/python bench/owners_cost.py --before 18f4740   # about 1 minute; needs gcc

A child process loads the fake libnvidia-ml.so.1 of the tests through LD_LIBRARY_PATH as the daemon does (8
plausible H200s: 18 active NVLink links each, two processes each), polls the nvml collector STATES times, and
builds the kubernetes collector's state from literal allocations as the kubelet lists them (7 pods holding a GPU
each, two pods sharing the eighth as time-slice replicas). Then it renders the exposition of those states as the
daemon renders a new snapshot (`snapshot_families`, then `TextFormat.render`) RENDERS times, each render with the
next polled NVML state in a new snapshot version, and times each render's CPU (`time.thread_time()`).

- before (`--before REF`: `git archive REF jaxmon`, run from a temporary directory): the nvml collector stamps the
  pods itself, from the kubelet's attribution on the exchange (DEVICE_PODS);
- after: no collector stamps pods; the owner transform adds them once per rendered snapshot. The child renders
  each snapshot twice, alternately with and without the transform, so that the transform's own cost is the
  difference of two interleaved series.

Rounds alternate (before, after, after, before, ...) so that the machine's load falls on both sides alike. The
poll itself (`update()`) is not changed by the transform: the collectors offer their identities and owners as
functions of their state, read at render time.
"""

from __future__ import annotations

import argparse
import json
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
STATES = 4
RENDERS = 150
WARMUP = 10
ROUNDS = 4  # per side

CHILD = """
import json, sys, time
import jaxmon
from jaxmon import exchange
from jaxmon.ownership.attribution import attribute
from jaxmon.collectors.base import standalone_context
from jaxmon.collectors.kubernetes import KubernetesCollector, KubernetesOptions, KubernetesState
from jaxmon.collectors.nvml import NvmlCollector, NvmlOptions
from jaxmon.exposition import TextFormat, snapshot_families
from jaxmon.snapshot import Snapshot
from jaxmon.sources.kubelet import Allocation

UUIDS = UUIDS_LITERAL
held = tuple(Allocation("team", f"train-{i}", "trainer", "nvidia.com/gpu", (u,)) for i, u in enumerate(UUIDS[:-1]))
held += tuple(Allocation("team", f"nb-{r}", "jupyter", "nvidia.com/gpu", (f"{UUIDS[-1]}::{r}",)) for r in range(2))
ctx = standalone_context(None)
nvml = NvmlCollector(NvmlOptions(), ctx)
kubernetes = KubernetesCollector(KubernetesOptions(), ctx)
collectors = [nvml, kubernetes]
pods = KubernetesState(devices=held, attribution=attribute(held), taken=0.0)
transform = None
if hasattr(exchange, "DEVICE_PODS"):  # before issue 35: the nvml collector stamps the pods itself
    ctx.exchange.constant(exchange.DEVICE_PODS, pods.attribution)
else:
    from jaxmon.ownership.owners import OwnerTransform
    for c in collectors:  # as jaxmon.compose.build_runtime wires them
        for channel, read in c.offers.items():
            ctx.exchange.offer(channel, c.name, read)
    transform = OwnerTransform(ctx.exchange)
polled = []
for _ in range(STATES):
    time.sleep(0.11)
    update = nvml.update()
    assert update.success and len(update.state.gpus) == GPUS, update
    polled.append(update.state)
nvml.stop()
fmt, bare_fmt = TextFormat(), TextFormat()
timed, bare = [], []
for i in range(WARMUP + RENDERS):
    snap = Snapshot(source="node", states={"nvml": polled[i % STATES], "kubernetes": pods}, version=i + 1)
    t0 = time.thread_time()
    body = fmt.render(snapshot_families(snap, collectors, None, *([transform] if transform else [])))
    t1 = time.thread_time()
    if transform is not None:  # the same snapshot without the owner step: the transform's own cost
        bare_body = bare_fmt.render(snapshot_families(snap, collectors, None))
        t2 = time.thread_time()
        if i >= WARMUP:
            bare.append(t2 - t1)
    if i >= WARMUP:
        timed.append(t1 - t0)
series = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
labelled = sum(1 for line in body.splitlines() if b'pod="' in line and b"kubernetes_pod_device_info" not in line)
print(json.dumps({"render": timed, "bare": bare, "series": series, "labelled": labelled, "jaxmon": jaxmon.__file__}))
"""


def run_child(scenario: Scenario, uuids: list[str], tree: Path | None) -> dict[str, Any]:
    """One child's renders, from this checkout's jaxmon or from `tree`'s."""
    code = CHILD.replace("UUIDS_LITERAL", repr(uuids)).replace("WARMUP", str(WARMUP)).replace("RENDERS", str(RENDERS))
    code = code.replace("STATES", str(STATES)).replace("GPUS", str(GPUS))
    return run_code(code, scenario.env(), tree)


def summary(rounds: list[dict[str, Any]], key: str) -> dict[str, Any]:
    values = sorted(x for r in rounds for x in r[key])
    return {
        "renders": len(values),
        "median_ms": median(values) * 1e3,
        "p90_ms": values[int(0.9 * len(values))] * 1e3,
        "mean_ms": statistics.fmean(values) * 1e3,
        "round_medians_ms": [median(r[key]) * 1e3 for r in rounds],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="a git revision whose jaxmon/ stamps pods per collector")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        devices = [
            device(i, processes=[{"pid": 1000 + i, "used": 1 << 30}, {"pid": 2000 + i, "used": 2 << 30}])
            for i in range(GPUS)
        ]
        scenario = Scenario(Path(tmp) / "scenario.json", devices)
        build()
        before_tree = Path(tmp) / "before"
        before_tree.mkdir()
        archive = subprocess.run(["git", "archive", args.before, "jaxmon"], cwd=ROOT, capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(before_tree)], input=archive.stdout, check=True)
        started = time.time()
        sides: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
        uuids = [d["uuid"] for d in devices]
        for k in range(ROUNDS):
            for side in (("before", "after"), ("after", "before"))[k % 2]:
                sides[side].append(run_child(scenario, uuids, before_tree if side == "before" else None))
        before, after = sides["before"], sides["after"]
        result = {
            "gpus": GPUS,
            "before_revision": args.before,
            "rounds_per_side": ROUNDS,
            "series": {"before": before[0]["series"], "after": after[0]["series"]},
            "pod_labelled_series": {"before": before[0]["labelled"], "after": after[0]["labelled"]},
            "render_cpu": {
                "before": summary(before, "render"),
                "after": summary(after, "render"),
                "after_without_the_transform": summary(after, "bare"),
            },
            "started": started,
        }
    save("owners_cost", result)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
