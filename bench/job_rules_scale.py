"""The job-view rules at scale (issue 21): a real Prometheus evaluates deploy/prometheus/job.yml over a synthetic
training job of 1 024 and 4 096 processes x 8 GPUs.

    .venv/bin/python bench/job_rules_scale.py [--processes 1024 4096] [--evals 16] [--dashboard PATH]

What it measures, for each job size:
(a) rule group evaluation time: Prometheus's own `evaluationTime` per group and per rule (/api/v1/rules, the same
    numbers as `prometheus_rule_group_last_duration_seconds`), over `--evals` evaluations of every group, median
    and max, and the `prometheus_rule_evaluation_duration_seconds` summary; then each rule's expression alone with
    /api/v1/query (stats=all: Prometheus's evalTotalTime) at the data's end, median of `--rounds`. Goal: every
    group under 1 s at 4 096 processes. It checks the answer too: the straggler process has the lowest host score,
    and JaxmonTrainingStraggler is pending (for: 10m) for it and for nothing else.
(b) the series jaxmon adds per host for training, counted from a real embedded exporter: a child process with
    JAX_NUM_CPU_DEVICES=8 and the tests' fake libnvidia-ml.so.1 (8 GPUs) calls jaxmon.start() and trains a step
    sharded over its 8 devices with jaxmon.track() / step() / badput(); its /metrics is scraped and the series of
    `jaxmon_training_*`, `jaxmon_device_peak_flops_per_second` and `jaxmon_workload_info` are counted. The same
    scrape checks that every synthetic family below has exactly the label names the real exporter gives it.
(c) the query time of the Job dashboard's panel queries (`--dashboard`, grafana/dashboards/jaxmon-job.json), with
    $workload, $job, $__rate_interval (1m), $__interval (15s), $__range (1h) substituted: instant (/api/v1/query)
    and over the last hour at a 15 s step (/api/v1/query_range), median of `--rounds`. Not measured when the file
    does not exist.

The data: for every process (one embedded jaxmon, one `instance`, `job="jaxmon"`) the series the job rules read,
with jaxmon's names and labels (jaxmon/families, collectors/nvml.py, collectors/probe.py): the step-time histogram
(19 buckets, _sum, _count), host wait, last step timestamp, dispatched step, jaxmon_workload_info, and per GPU the
probe's FLOP/s and utilization, jaxmon_device_info (source="local" and "nvml"), NVML's SM clock and 9 throttle
reasons, bytes in use: 145 series per process. Counters grow realistically (a 0.5 s step that wobbles, each
process's own host-wait ratio), one process is the straggler (host wait 60 % against 1-6 % for the others).
The hour before the run goes in as OpenMetrics through `promtool tsdb create-blocks-from openmetrics` (15 s apart,
each process at its own place in the interval), the minutes that took are backfilled the same way, and from then
on a small scrape target in a child process serves the same model live (honor_labels, 15 s), so the rules always
evaluate at "now" over data that reaches the present. Worst case for the device rules: every GPU's utilization
reads under 0.1 (every probe reading passes the idle filter) and no GPU is idle-throttled.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import math
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from operator import add
from pathlib import Path
from typing import Any

import numpy as np
import requests
import yaml
from common import PY, RESULTS, ROOT, Child, Samples, free_port, median, parse_samples, save, wait_until

from jaxmon.families import go_float
from jaxmon.sources.nvml import CLOCKS_EVENT_REASONS
from jaxmon.training.ledger import DURATION_BUCKETS

JOB = "jaxmon"
WORKLOAD = "llama-scale"
DEVICES = 8
INTERVAL = 15.0  # scrape and evaluation interval
KIND = "NVIDIA H100 80GB HBM3"
STEP = 0.5  # seconds per training step, job-wide (a synchronous job)
OMEGA = 2 * math.pi / 300  # the step rate's wobble: +/- 21 % over 5 minutes
WOBBLE = 20.0
PROBE_FLOPS = 3.2e13
POWER = 600.0  # watts per GPU
GIB = 2**30
REASONS = tuple(CLOCKS_EVENT_REASONS)
LE = (*DURATION_BUCKETS, math.inf)
# Share of steps at or under each bound: log-normal around STEP (sigma 0.25); the +Inf bucket holds every step.
FRACTIONS = np.array([0.5 * (1 + math.erf(math.log(b / STEP) / (0.25 * math.sqrt(2)))) for b in LE[:-1]] + [1.0])
DASHBOARD = ROOT / "grafana" / "dashboards" / "jaxmon-job.json"
RULES = ROOT / "deploy" / "prometheus" / "job.yml"
GROUP_GOAL_S = 1.0
LOOKBACK = 300.0  # Prometheus's lookback delta and the rules' rate window
FLEET_RULES = ROOT / "deploy" / "prometheus" / "fleet.yml"
# History backfilled before the run, minutes: the hour's series (job.yml's once-a-minute records, which its rules
# read over [1h]) and the rest (read over [5m], and jaxmon_device_info over [10m]: 12 minutes, the lookback's 5 beyond
# the run's start to spare). The Job dashboard's panels over [1h] of raw series read those 12 minutes only here.
LONG_HISTORY, SHORT_HISTORY = 60, 12
# Backfilled in spans of this many minutes, one promtool run each: promtool holds a span's samples in memory
# (1.3 x the OpenMetrics text; 2 GB for an hour of 256 processes), so a span's text stays a few GB at 8,192.
BACKFILL_SPAN = 4
SAMPLE_EVERY = 500.0  # seconds between sampled traces: every 1000 steps of 0.5 s (profile.every's default)
BADPUT = ("startup", "compile", "checkpoint", "restore", "host", "restart", "stall")  # every built-in kind
# The two mesh axes of an 8-GPU host job: model within the host (NVLink), data across hosts (the network).
AXES = (("all-gather", "model", "nvlink", 450e9, 6.0e8), ("all-reduce", "data", "network", 50e9, 2.0e8))


def fmt_labels(labels: dict[str, str]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))


def prefix(name: str, labels: dict[str, str]) -> str:
    """`name{labels} `: a sample line up to its value."""
    return f"{name}{{{fmt_labels(labels)}}} "


@dataclass
class Family:
    name: str  # as # TYPE names it
    kind: str  # gauge, counter, histogram
    per_process: int
    prefixes: Callable[[int], list[str]]  # process p's series, in order
    values: Callable[[slice, np.ndarray], np.ndarray] | None = None  # (processes, t[P, T]) -> [P, per_process, T]
    const: str | None = None  # a static family's value
    # Minutes of history before the run: the longest range a rule reads it over and Prometheus's lookback (the
    # hour's families: a `[1h]` rule reads them; the rest: `[5m]`, and `[10m]` of jaxmon_device_info).
    history: int = SHORT_HISTORY
    live: bool = True  # served by the live target (a record's history is backfilled only: the rule goes on with it)
    every: float = INTERVAL  # seconds between its points (job.yml's once-a-minute records: 60)

    def samples(self) -> set[str]:
        return {p.split("{", 1)[0] for p in self.prefixes(0)}


class Job:
    """The synthetic training job: every number is a function of time, so the backfill and the live target agree."""

    def __init__(self, n: int, begin: float, seed: int = 21) -> None:
        rng = np.random.default_rng(seed)
        self.n = n
        self.straggler = int(rng.integers(n))
        self.begin = begin + rng.uniform(0, 30, n)  # each process's jaxmon started then (its first step)
        self.offset = rng.uniform(0, INTERVAL, n)  # its scrape's place in the interval
        self.rule_offset = rng.uniform(0, 60.0)  # the once-a-minute records' group's place in the minute
        self.phase = rng.uniform(0, 2 * math.pi, n)
        self.wait = rng.uniform(0.01, 0.06, n)  # share of time its devices wait for its host
        self.wait[self.straggler] = 0.6
        # A compute straggler (another process): one device computes slowly, every other device waits for it in
        # the collectives; the host straggler's devices come to them last and wait least too (its host explains
        # it: JaxmonTrainingComputeStraggler must name the compute straggler alone).
        self.compute = int((self.straggler + 1 + rng.integers(n - 1)) % n) if n > 1 else 0
        self.collective_wait = 0.25 + 0.02 * rng.standard_normal((n, DEVICES))
        self.collective_wait[self.straggler] = 0.02
        self.collective_wait[self.compute] = 0.2
        self.collective_wait[self.compute, 5] = 0.02
        self.mfu = 0.45 + 0.02 * rng.standard_normal((n, DEVICES))
        self.sum_factor = 1 + rng.normal(0, 0.003, n)
        self.behind = np.ones(n)
        self.behind[self.straggler] = 0  # the others dispatched one step further: they wait for it
        self.pid = rng.integers(1000, 4_000_000, n)
        shape = (n, DEVICES)
        self.flops = PROBE_FLOPS * (1 + 0.02 * rng.standard_normal(shape))
        self.dphase = rng.uniform(0, 2 * math.pi, shape)
        self.clock_mhz = 1980.0 - rng.integers(0, 15, shape)
        self.memory = 62 * GIB * (1 + 0.02 * rng.standard_normal(shape))
        self.power = POWER * (1 + 0.03 * rng.standard_normal(shape))

    # -- labels ----------------------------------------------------------------------------------------------

    def host(self, p: int) -> str:
        return f"host-{p:05d}"

    def target(self, p: int) -> dict[str, str]:
        return {"job": JOB, "instance": f"{self.host(p)}:10401"}

    def training(self, p: int) -> dict[str, str]:
        return {
            **self.target(p),
            "workload": WORKLOAD,
            "process_index": str(p),
            "process_count": str(self.n),
            "host": self.host(p),
        }

    def local(self, p: int, i: int) -> dict[str, str]:
        """A JAX device: global ids across the job's processes, as JAX numbers GPUs."""
        return {**self.target(p), "device": str(DEVICES * p + i), "platform": "gpu", "workload": WORKLOAD}

    def nvml(self, p: int, i: int) -> dict[str, str]:
        """An NVML GPU of a multi-process job: NVML's index (device_match="nvml_index")."""
        return {**self.target(p), "device": str(i), "platform": "gpu", "source": "nvml"}

    def device_info(self, p: int) -> list[str]:
        out = []
        for i in range(DEVICES):
            identity = {"device_kind": KIND, "process_index": str(p), "coords": "", "core_on_chip": ""}
            out.append(prefix("jaxmon_device_info", {**self.local(p, i), **identity, "source": "local"}))
        for i in range(DEVICES):
            gpu = {
                "uuid": f"GPU-{p:08x}-1111-2222-3333-{i:012x}",
                "pci_bus_id": f"00000000:{0x18 + i:02X}:00.0",
                "name": KIND,
                "device_match": "nvml_index",
            }
            out.append(prefix("jaxmon_device_info", {**self.nvml(p, i), **gpu}))
        return out

    # -- numbers ---------------------------------------------------------------------------------------------

    def steps(self, ps: slice, t: np.ndarray) -> np.ndarray:
        b = self.begin[ps, None]
        s = (t - b) / STEP + WOBBLE * (np.sin(OMEGA * t) - np.sin(OMEGA * b))
        return np.floor(np.maximum(s, 0.0))

    def histogram(self, ps: slice, t: np.ndarray) -> np.ndarray:
        count = self.steps(ps, t)
        buckets = np.floor(FRACTIONS[None, :, None] * count[:, None, :])
        total = np.maximum(t - self.begin[ps, None], 0.0) * self.sum_factor[ps, None]
        return np.concatenate([buckets, count[:, None, :], total[:, None, :]], axis=1)

    def host_wait(self, ps: slice, t: np.ndarray) -> np.ndarray:
        b, ph = self.begin[ps, None], self.phase[ps, None]
        w = self.wait[ps, None] * ((t - b) + 10 * (np.sin(OMEGA * t + ph) - np.sin(OMEGA * b + ph)))
        return np.maximum(w, 0.0)[:, None, :]

    def last_step(self, ps: slice, t: np.ndarray) -> np.ndarray:
        return (t - np.mod(t - self.begin[ps, None], STEP))[:, None, :]

    def steps_total(self, ps: slice, t: np.ndarray) -> np.ndarray:
        return (self.steps(ps, t) + 1)[:, None, :]  # steps completed: one more than the durations between them

    def dispatched(self, ps: slice, t: np.ndarray) -> np.ndarray:
        return (self.steps(ps, t) + self.behind[ps, None])[:, None, :]

    def _wave(self, ps: slice, t: np.ndarray, period: float) -> np.ndarray:
        return np.sin(2 * math.pi / period * t[:, None, :] + self.dphase[ps, :, None])

    def probe_flops(self, ps: slice, t: np.ndarray) -> np.ndarray:
        return self.flops[ps, :, None] * (1 + 0.01 * self._wave(ps, t, 97))

    def utilization(self, ps: slice, t: np.ndarray) -> np.ndarray:
        return 0.04 + 0.015 * (1 + self._wave(ps, t, 131))

    def sm_clock(self, ps: slice, t: np.ndarray) -> np.ndarray:
        return (self.clock_mhz[ps, :, None] - np.round(3 * (1 + self._wave(ps, t, 173)))) * 1e6

    def energy(self, ps: slice, t: np.ndarray) -> np.ndarray:
        """NVML's energy counter since the driver loaded (a day before the job): POWER W, +/- 5 % over 4 minutes."""
        since = t[:, None, :] - (self.begin[ps, None, None] - 86400)
        return np.round(self.power[ps, :, None] * (since + 2 * self._wave(ps, t, 241)), 3)

    def bytes_in_use(self, ps: slice, t: np.ndarray) -> np.ndarray:
        return np.round(self.memory[ps, :, None] + GIB / 2 * self._wave(ps, t, 211))

    def _up(self, ps: slice, t: np.ndarray) -> np.ndarray:
        return np.maximum(t - self.begin[ps, None], 0.0)

    def goodput(self, ps: slice, t: np.ndarray) -> np.ndarray:
        """Productive seconds, then each badput kind's (checkpoint 4 %, startup a minute, the rest none)."""
        up = self._up(ps, t)
        kinds = [np.zeros_like(up) for _ in BADPUT]
        kinds[BADPUT.index("checkpoint")] = 0.04 * up
        kinds[BADPUT.index("startup")] = np.minimum(up, 60.0)
        return np.stack([np.maximum(0.96 * up - 60.0, 0.0), *kinds], axis=1)

    def throughput(self, ps: slice, t: np.ndarray) -> np.ndarray:
        """Tokens and examples: each process's share of the job's (2,048 sequences of 4,096 tokens a step)."""
        steps = self.steps(ps, t)
        return np.stack([steps * 2048 * 4096 / self.n, steps * 2048 / self.n], axis=1)

    def sample_step(self, ps: slice, t: np.ndarray) -> np.ndarray:
        """The first step of the last sampled trace (every SAMPLE_EVERY s: the same steps in every process)."""
        at = np.floor(t / SAMPLE_EVERY) * SAMPLE_EVERY
        return (np.floor((at - self.begin[ps, None]) / STEP / 1000) * 1000)[:, None, :]

    def wait_ratio(self, ps: slice, t: np.ndarray) -> np.ndarray:
        """Each device's collective wait in the last sample (a new figure at each sample)."""
        sample = np.floor(t / SAMPLE_EVERY)[:, None, :]
        wobble = 0.01 * np.sin(sample * 1.7 + self.dphase[ps, :, None])
        return np.clip(self.collective_wait[ps, :, None] + wobble, 0.0, 1.0)

    def wait_min(self, ps: slice, t: np.ndarray) -> np.ndarray:
        """jaxmon:training_collective_wait_ratio:min's history: the least of the process's devices' waits."""
        return self.wait_ratio(ps, t).min(axis=1)[:, None, :]

    def mfu_ratio(self, ps: slice, t: np.ndarray) -> np.ndarray:
        return np.broadcast_to(self.mfu[ps, :, None], (*self.mfu[ps].shape, t.shape[1])) + 0 * t[:, None, :]

    def profiled(self, ps: slice, t: np.ndarray) -> np.ndarray:
        """Sampled seconds: two steps a sample (at SAMPLE_EVERY), on every device."""
        sampled = np.floor((t - self.begin[ps, None]) / SAMPLE_EVERY).clip(0) * 2 * STEP
        return np.broadcast_to(sampled[:, None, :], (sampled.shape[0], DEVICES, t.shape[1]))

    def nominal(self, ps: slice, t: np.ndarray) -> np.ndarray:
        """Each link's nominal bandwidth on every device (jaxmon's table: a constant)."""
        per_link = np.repeat([a[3] for a in AXES], DEVICES)[None, :, None]
        return np.broadcast_to(per_link, (ps.stop - ps.start, len(AXES) * DEVICES, t.shape[1]))

    def axes_counters(self, ps: slice, t: np.ndarray) -> np.ndarray:
        """Per device: each axis's exposed collective seconds in the samples, then its collective bytes."""
        profiled = self.profiled(ps, t)
        steps = self.steps(ps, t)[:, None, :]
        exposed = [profiled * share for share in (0.02, 0.05)]
        moved = [np.broadcast_to(steps * per_step, profiled.shape) for *_, per_step in AXES]
        return np.concatenate([*exposed, *moved], axis=1)

    def families(self) -> list[Family]:
        hist = "jaxmon_training_step_duration_seconds"

        def hist_prefixes(p: int) -> list[str]:
            labels = self.training(p)
            out = [prefix(hist + "_bucket", {**labels, "le": go_float(b)}) for b in LE]
            return [*out, prefix(hist + "_count", labels), prefix(hist + "_sum", labels)]

        def per_process(name: str) -> Callable[[int], list[str]]:
            return lambda p: [prefix(name, self.training(p))]

        def per_gpu(name: str) -> Callable[[int], list[str]]:
            return lambda p: [prefix(name, self.local(p, i)) for i in range(DEVICES)]

        def per_device(name: str, **more: str) -> Callable[[int], list[str]]:
            """A training family's series of process p's devices (the training labels, device and platform)."""
            return lambda p: [
                prefix(name, {**self.training(p), "device": str(DEVICES * p + i), "platform": "gpu", **more})
                for i in range(DEVICES)
            ]

        def axes(name: str) -> Callable[[int], list[str]]:
            """Per axis, process p's devices' series of `name`, labelled with the axis's op and link."""
            return lambda p: [
                line for op, axis, link, *_ in AXES for line in per_device(name, op=op, axes=axis, link=link)(p)
            ]

        def bandwidth(p: int) -> list[str]:
            return [
                line
                for _, _, link, nominal, _ in AXES
                for line in per_device("jaxmon_link_nominal_bandwidth_bytes_per_second", link=link)(p)
            ]

        def record(name: str, host: bool = True, **more: str) -> Callable[[int], list[str]]:
            """A job.yml once-a-minute record of process p (its labels: job, instance, workload, process_index)."""
            keep = ("job", "instance", "workload", "process_index") + (("host",) if host else ())
            return lambda p: [prefix(name, {**{k: self.training(p)[k] for k in keep}, **more})]

        def per_axis(name: str) -> Callable[[int], list[str]]:
            return lambda p: [
                line for _, axis, link, *_ in AXES for line in record(name, host=False, axes=axis, link=link)(p)
            ]

        # The history of job.yml's once-a-minute records (their rules go on with them from the run's start).
        records = [
            ("jaxmon:training_collective_wait_ratio:min", 1, record, self.wait_min),
            ("jaxmon:training_host_wait_seconds:process1m", 1, record, self.host_wait),
            ("jaxmon:training_steps:process1m", 1, lambda n: record(n, host=False), self.steps_total),
            ("jaxmon:training_profile_sample_step:process1m", 1, lambda n: record(n, host=False), self.sample_step),
            (
                "jaxmon:training_collective_bytes:process_avg1m",
                len(AXES),
                per_axis,
                lambda ps, t: self.axes_counters(ps, t)[:, len(AXES) * DEVICES :: DEVICES],
            ),
            (
                "jaxmon:training_profile_exposed_collective_seconds:process_sum1m",
                len(AXES),
                per_axis,
                lambda ps, t: DEVICES * self.axes_counters(ps, t)[:, : len(AXES) * DEVICES : DEVICES],
            ),
            (
                "jaxmon:training_profiled_seconds:process_sum1m",
                1,
                lambda n: record(n, host=False),
                lambda ps, t: DEVICES * self.profiled(ps, t)[:, :1],
            ),
        ]
        backfilled = [
            Family(name, "gauge", per, labels(name), values, history=LONG_HISTORY, live=False, every=60.0)
            for name, per, labels, values in records
        ]

        def info(p: int) -> list[str]:
            labels = {k: v for k, v in self.training(p).items() if k != "process_count"}
            return [prefix("jaxmon_workload_info", {**labels, "pid": str(self.pid[p]), "jax_version": "0.10.2"})]

        return [
            Family("jaxmon_workload_info", "gauge", 1, info, const="1"),
            Family(hist, "histogram", len(LE) + 2, hist_prefixes, self.histogram),
            Family(
                "jaxmon_training_host_wait_seconds",
                "counter",
                1,
                per_process("jaxmon_training_host_wait_seconds_total"),
                self.host_wait,
            ),
            Family(
                "jaxmon_training_steps",
                "counter",
                1,
                per_process("jaxmon_training_steps_total"),
                self.steps_total,
            ),
            Family(
                "jaxmon_training_last_step_timestamp_seconds",
                "gauge",
                1,
                per_process("jaxmon_training_last_step_timestamp_seconds"),
                self.last_step,
            ),
            Family(
                "jaxmon_training_dispatched_step",
                "gauge",
                1,
                per_process("jaxmon_training_dispatched_step"),
                self.dispatched,
            ),
            Family("jaxmon_device_info", "gauge", 2 * DEVICES, self.device_info, const="1"),
            Family(
                "jaxmon_probe_flops_per_second",
                "gauge",
                DEVICES,
                per_gpu("jaxmon_probe_flops_per_second"),
                self.probe_flops,
            ),
            Family(
                "jaxmon_device_utilization_ratio",
                "gauge",
                DEVICES,
                per_gpu("jaxmon_device_utilization_ratio"),
                self.utilization,
            ),
            Family(
                "jaxmon_device_sm_clock_hertz",
                "gauge",
                DEVICES,
                lambda p: [prefix("jaxmon_device_sm_clock_hertz", self.nvml(p, i)) for i in range(DEVICES)],
                self.sm_clock,
            ),
            Family(
                "jaxmon_device_energy_joules",
                "counter",
                DEVICES,
                lambda p: [prefix("jaxmon_device_energy_joules_total", self.nvml(p, i)) for i in range(DEVICES)],
                self.energy,
            ),
            Family(
                "jaxmon_device_throttled",
                "gauge",
                DEVICES * len(REASONS),
                lambda p: [
                    prefix("jaxmon_device_throttled", {**self.nvml(p, i), "reason": r})
                    for i in range(DEVICES)
                    for r in REASONS
                ],
                const="0",
            ),
            Family(
                "jaxmon_memory_bytes_in_use", "gauge", DEVICES, per_gpu("jaxmon_memory_bytes_in_use"), self.bytes_in_use
            ),
            # Goodput, throughput, MFU (the goodput group and fleet.yml), the sampled traces (the compute straggler
            # and the links groups) and the links' nominal bandwidth.
            Family(
                "jaxmon_training_productive_seconds",
                "counter",
                1,
                per_process("jaxmon_training_productive_seconds_total"),
                lambda ps, t: self.goodput(ps, t)[:, :1],
            ),
            Family(
                "jaxmon_training_badput_seconds",
                "counter",
                len(BADPUT),
                lambda p: [
                    prefix("jaxmon_training_badput_seconds_total", {**self.training(p), "kind": k}) for k in BADPUT
                ],
                lambda ps, t: self.goodput(ps, t)[:, 1:],
            ),
            Family(
                "jaxmon_training_tokens",
                "counter",
                1,
                per_process("jaxmon_training_tokens_total"),
                lambda ps, t: self.throughput(ps, t)[:, :1],
            ),
            Family(
                "jaxmon_training_examples",
                "counter",
                1,
                per_process("jaxmon_training_examples_total"),
                lambda ps, t: self.throughput(ps, t)[:, 1:],
            ),
            Family(
                "jaxmon_training_model_flops_utilization_ratio",
                "gauge",
                DEVICES,
                per_device("jaxmon_training_model_flops_utilization_ratio"),
                self.mfu_ratio,
            ),
            Family(
                "jaxmon_training_profile_sample_step",
                "gauge",
                1,
                per_process("jaxmon_training_profile_sample_step"),
                self.sample_step,
            ),
            Family(
                "jaxmon_training_collective_wait_ratio",
                "gauge",
                DEVICES,
                per_device("jaxmon_training_collective_wait_ratio"),
                self.wait_ratio,
            ),
            Family(
                "jaxmon_training_profiled_seconds",
                "counter",
                DEVICES,
                per_device("jaxmon_training_profiled_seconds_total"),
                self.profiled,
            ),
            Family(
                "jaxmon_training_profile_exposed_collective_seconds",
                "counter",
                len(AXES) * DEVICES,
                axes("jaxmon_training_profile_exposed_collective_seconds_total"),
                lambda ps, t: self.axes_counters(ps, t)[:, : len(AXES) * DEVICES],
            ),
            Family(
                "jaxmon_training_collective_bytes",
                "counter",
                len(AXES) * DEVICES,
                axes("jaxmon_training_collective_bytes_total"),
                lambda ps, t: self.axes_counters(ps, t)[:, len(AXES) * DEVICES :],
            ),
            Family(
                "jaxmon_link_nominal_bandwidth_bytes_per_second",
                "gauge",
                len(AXES) * DEVICES,
                bandwidth,
                self.nominal,
            ),
            *backfilled,
        ]


# -- the backfill -----------------------------------------------------------------------------------------------


def write_openmetrics(
    job: Job, path: Path, after: float, upto: float, start: float, chunk: int = 128, hour: bool | None = None
) -> dict[str, Any]:
    """Every series of `job` every 15 s in (after, upto], each process at its offset in the interval, each family
    from `start` - its history on."""
    started = time.monotonic()
    lines = 0
    with path.open("w", buffering=1 << 22) as f:
        for fam in job.families():
            if hour is not None and (fam.history == LONG_HISTORY) != hour:
                continue
            first = max(after, start - fam.history * 60)
            if first >= upto:
                continue
            grid = np.arange(math.floor(after / fam.every) * fam.every, upto + fam.every, fam.every)
            f.write(f"# TYPE {fam.name} {fam.kind}\n")
            for p0 in range(0, job.n, chunk):
                ps = slice(p0, min(job.n, p0 + chunk))
                offset = (
                    job.offset[ps, None] if fam.every == INTERVAL else np.full((ps.stop - ps.start, 1), job.rule_offset)
                )
                t = np.round(grid[None, :] + offset, 3)
                values = fam.values(ps, t) if fam.values is not None else None
                for i, p in enumerate(range(ps.start, ps.stop)):
                    keep = np.nonzero((t[i] > first) & (t[i] <= upto))[0]
                    if not len(keep):
                        continue
                    lo, hi = int(keep[0]), int(keep[-1]) + 1
                    suffix = [f" {x:.3f}\n" for x in t[i, lo:hi].tolist()]
                    if values is None:
                        elements = ["", *(fam.const + s for s in suffix)]  # type: ignore[operator]
                        text = "".join(pre.join(elements) for pre in fam.prefixes(p))
                    else:
                        rows = values[i, :, lo:hi].tolist()
                        text = "".join(
                            pre.join(["", *map(add, map(repr, row), suffix)])
                            for pre, row in zip(fam.prefixes(p), rows, strict=True)
                        )
                    f.write(text)
                    lines += fam.per_process * (hi - lo)
        f.write("# EOF\n")
    return {"samples": lines, "bytes": path.stat().st_size, "seconds": round(time.monotonic() - started, 1)}


def backfill(
    job: Job, work: Path, data: Path, name: str, after: float, upto: float, start: float, hour: bool | None = None
) -> dict[str, Any]:
    """OpenMetrics for (after, upto] (each family from `start` - its history; `hour`: only the hour's families, or
    only the others), then promtool's blocks in `data`, a span of minutes at a time (promtool holds a span's samples
    in memory; the hour's families, a few series a process, in one span: one block, as a running Prometheus holds
    the hour in one head); each file is removed after."""
    span = max(60.0, min(3600.0, 60.0 * (20_000 // job.n)))  # 20 minutes at 1,024 processes, 2 at 8,192
    if hour:
        span = upto - after
    out: dict[str, Any] = {"samples": 0, "bytes": 0, "seconds": 0.0, "promtool_seconds": 0.0, "spans": 0}
    promtool_rss = 0
    at = after
    while at < upto:
        to = min(upto, at + span)
        om = work / f"{name}.om"
        wrote = write_openmetrics(job, om, at, to, start, hour=hour)
        began = time.monotonic()
        res = subprocess.run(
            [
                "/usr/bin/time",
                "-f",
                "%M",
                "promtool",
                "tsdb",
                "create-blocks-from",
                "openmetrics",
                "-q",
                str(om),
                str(data),
            ],
            capture_output=True,
            text=True,
        )
        om.unlink()
        if res.returncode != 0:
            raise RuntimeError(
                f"promtool create-blocks-from openmetrics failed:\n{res.stdout[-3000:]}{res.stderr[-3000:]}"
            )
        promtool_rss = max(promtool_rss, int(res.stderr.strip().splitlines()[-1]) * 1024)
        for key in ("samples", "bytes", "seconds"):
            out[key] += wrote[key]
        out["promtool_seconds"] += time.monotonic() - began
        out["spans"] += 1
        at = to
    out["promtool_seconds"] = round(out["promtool_seconds"], 1)
    out["promtool_max_rss_bytes"] = promtool_rss
    print(
        f"  {name}: {out['samples']:,} samples, {out['bytes'] / 1e9:.2f} GB of OpenMetrics in {out['spans']} spans "
        f"({out['seconds']:.0f} s), promtool {out['promtool_seconds']} s, at most {promtool_rss / 2**30:.1f} GiB"
    )
    return out


# -- the live target --------------------------------------------------------------------------------------------


def serve(job: Job, port: int, shards: list[slice]) -> None:
    """A scrape target in a child process: /metrics/K serves shard K's processes as the model has them now."""
    fams = job.families()
    static: list[bytes] = []
    dynamic: list[list[tuple[Family, list[str]]]] = []
    for ps in shards:
        text, dyn = [], []
        for fam in fams:
            if not fam.live:
                continue
            pres = [pre for p in range(ps.start, ps.stop) for pre in fam.prefixes(p)]
            if fam.values is None:
                text.append(f"# TYPE {fam.name} {fam.kind}\n" + "".join(pre + fam.const + "\n" for pre in pres))  # type: ignore[operator]
            else:
                dyn.append((fam, pres))
        static.append("".join(text).encode())
        dynamic.append(dyn)

    def render(k: int) -> bytes:
        ps = shards[k]
        t = np.full((ps.stop - ps.start, 1), time.time())
        out = []
        for fam, pres in dynamic[k]:
            name = fam.name + ("_total" if fam.kind == "counter" else "")
            out.append(f"# TYPE {name} {fam.kind}\n")
            out.append("".join(map("{}{!r}\n".format, pres, fam.values(ps, t).ravel().tolist())))  # type: ignore[misc]
        return static[k] + "".join(out).encode()

    sys.path.insert(0, str(ROOT))
    from tests.helpers import text_targets

    text_targets(render, len(shards), port).serve_forever()


# -- Prometheus -------------------------------------------------------------------------------------------------


class Prometheus:
    def __init__(
        self,
        work: Path,
        data: Path,
        rules: str,
        fleet: str,
        target_port: int,
        shards: int,
        name: str,
        quiet: bool = False,
    ) -> None:
        """The measured Prometheus over `data`; `quiet`: one with no rules and nothing to scrape, for the queries
        alone (the other's TSDB once it stopped: its CPU is then the queries' own)."""
        (work / "job.yml").write_text(rules)
        (work / "fleet.yml").write_text(fleet)
        config: dict[str, Any] = {
            "global": {"scrape_interval": "15s", "scrape_timeout": "10s", "evaluation_interval": "15s"},
            "rule_files": ["job.yml", "fleet.yml"],
            "scrape_configs": [
                {
                    "job_name": "synthetic",
                    "honor_labels": True,  # the series carry their own job and instance (one per process)
                    "static_configs": [
                        {
                            "targets": [f"127.0.0.1:{target_port}"],
                            "labels": {"__metrics_path__": f"/metrics/{k}", "instance": f"synthetic-{k}"},
                        }
                        for k in range(shards)
                    ],
                }
            ],
        }
        if quiet:
            config = {"global": config["global"]}
        (work / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
        self.work, self.data = work, data
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        argv = [
            "prometheus",
            f"--config.file={work / 'prometheus.yml'}",
            f"--storage.tsdb.path={data}",
            "--storage.tsdb.retention.time=3650d",
            f"--web.listen-address=127.0.0.1:{self.port}",
        ]
        self.child = Child(argv, env=dict(os.environ), name=name, cwd=work)
        wait_until(self.ready, 300, "prometheus /-/ready", step=0.5, detail=lambda: self.child.log()[-3000:])

    def ready(self) -> bool:
        if not self.child.alive():
            raise RuntimeError(f"prometheus exited:\n{self.child.log()[-3000:]}")
        with contextlib.suppress(requests.RequestException):
            return requests.get(self.url + "/-/ready", timeout=2).status_code == 200
        return False

    def api(self, path: str, **params: Any) -> dict[str, Any]:
        if params:
            r = requests.post(self.url + path, data=params, timeout=300)
        else:
            r = requests.get(self.url + path, timeout=60)
        doc: dict[str, Any] = r.json()
        if doc.get("status") != "success":
            raise RuntimeError(f"{path} {params}: {doc.get('errorType')}: {doc.get('error')}")
        return doc

    def query(self, expr: str, **params: Any) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.api("/api/v1/query", query=expr, **params)["data"]["result"]
        return result

    def metrics(self) -> Samples:
        return parse_samples(requests.get(self.url + "/metrics", timeout=30).text)

    def wait_idle(self, timeout: float = 900.0) -> float:
        """Wait until Prometheus uses under 2 % of a CPU over 10 s (its start's own work done: the WAL's replay, a
        compaction of the backfilled blocks, the garbage they left); the seconds it took."""
        began = time.monotonic()
        while time.monotonic() - began < timeout:
            before = self.cpu_seconds()
            time.sleep(10)
            if self.cpu_seconds() - before < 0.2:
                break
        return round(time.monotonic() - began, 1)

    def cpu_seconds(self) -> float:
        """The CPU time Prometheus has used (user + system)."""
        fields = Path(f"/proc/{self.child.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def rss(self) -> int:
        for line in Path(f"/proc/{self.child.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0


def rule_key(rule: dict[str, Any]) -> str:
    signal = rule.get("labels", {}).get("signal")
    return rule["name"] + (f"{{signal={signal}}}" if signal else "")


def epoch(rfc3339: str) -> float:
    """An RFC 3339 time as Prometheus writes it (nanoseconds, Z) in Unix seconds."""
    m = re.fullmatch(r"(.+T\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)", rfc3339)
    if m is None:
        raise ValueError(rfc3339)
    zone = "+00:00" if m.group(3) == "Z" else m.group(3)
    return dt.datetime.fromisoformat(m.group(1) + (m.group(2) or ".0")[:7] + zone).timestamp()


def collect_evaluations(prom: Prometheus, groups: int, evals: int, steady_from: float) -> dict[str, Any]:
    """Every group's evaluationTime (and each rule's), from the first whole evaluation seen until every group has
    `evals` evaluations that started after `steady_from` (their 5 m windows then lie in the head alone)."""
    seen: dict[str, str] = {}
    every: dict[str, float] = {}  # each group's interval, seconds
    rounds: dict[str, list[dict[str, Any]]] = {}
    problems: list[str] = []
    metric_rounds: list[dict[str, float]] = []
    deadline = time.monotonic() + max(0.0, steady_from - time.time()) + evals * INTERVAL * 3 + 120
    while True:
        new = False
        for group in prom.api("/api/v1/rules")["data"]["groups"]:
            name, last = group["name"], group["lastEvaluation"]
            every[name] = float(group.get("interval") or INTERVAL)
            if last.startswith("0001") or seen.get(name) == last:
                continue
            first = name not in seen
            seen[name] = last
            if first:
                continue  # the evaluation in progress when we started looking may be partial: start at the next
            new = True
            rules = {rule_key(r): r["evaluationTime"] for r in group["rules"]}
            for r in group["rules"]:
                if r.get("health") != "ok":
                    problems.append(f"{rule_key(r)}: {r.get('health')} {r.get('lastError')}")
            at = epoch(last)
            rounds.setdefault(name, []).append(
                {"at": at, "steady": at > steady_from, "seconds": group["evaluationTime"], "rules": rules}
            )
        if new:
            metric_rounds.append(
                {
                    dict(labels)["rule_group"].rsplit(";", 1)[1]: value
                    for (n, labels), value in prom.metrics().items()
                    if n == "prometheus_rule_group_last_duration_seconds"
                }
            )
        steady = {g: sum(r["steady"] for r in rs) for g, rs in rounds.items()}
        # A group of interval 1m (job.yml's once-a-minute records) needs as long as the others' `evals`: a quarter.
        wanted = {g: max(3, round(evals * INTERVAL / every.get(g, INTERVAL))) for g in steady}
        if len(steady) >= groups and all(c >= wanted[g] for g, c in steady.items()):
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"rule groups did not evaluate {evals} times: {steady}")
        time.sleep(3)
    return {"rounds": rounds, "problems": sorted(set(problems)), "last_duration_metric": metric_rounds}


def summarise(rounds: dict[str, list[dict[str, Any]]], steady: bool) -> dict[str, Any]:
    groups = {}
    for name, every in rounds.items():
        rs = [r for r in every if r["steady"] == steady]
        if not rs:
            continue
        secs = [r["seconds"] for r in rs]
        per_rule = {}
        for key in rs[0]["rules"]:
            values = [r["rules"][key] for r in rs if key in r["rules"]]
            per_rule[key] = {"median_s": median(values), "max_s": max(values)}
        groups[name] = {"evaluations": len(secs), "median_s": median(secs), "max_s": max(secs), "rules": per_rule}
    return groups


def rule_expressions(text: str) -> list[tuple[str, str, str]]:
    """(group, rule key, expression) of every rule."""
    out = []
    for group in yaml.safe_load(text)["groups"]:
        for rule in group["rules"]:
            name = rule.get("record") or rule["alert"]
            r = {"name": name, "labels": rule.get("labels", {})}
            out.append((group["name"], rule_key(r), rule["expr"]))
    return out


def timed_query(prom: Prometheus, path: str, **params: Any) -> dict[str, Any]:
    """One query's time (Prometheus's evalTotalTime, and the wall time around it), the CPU time Prometheus used for
    it (all of the process's: run on the quiet Prometheus, nothing else uses it), its series and samples read."""
    started, cpu = time.perf_counter(), prom.cpu_seconds()
    try:
        doc = prom.api(path, stats="all", **params)
    except RuntimeError as exc:
        return {"error": str(exc), "wall_s": time.perf_counter() - started}
    wall = time.perf_counter() - started
    cpu = prom.cpu_seconds() - cpu
    data = doc["data"]
    timings = data.get("stats", {}).get("timings", {})
    samples = data.get("stats", {}).get("samples", {})
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "eval_s": timings.get("evalTotalTime"),
        "series": len(data["result"]),
        "samples": samples.get("totalQueryableSamples"),
    }


def time_queries(prom: Prometheus, queries: list[tuple[str, str]], rounds: int, at: float, ranged: bool) -> Any:
    """Each query `rounds` times (rounds alternate the order); median and max of Prometheus's evalTotalTime."""
    raw: dict[str, list[dict[str, Any]]] = {key: [] for key, _ in queries}
    for r in range(rounds):
        order = queries if r % 2 == 0 else list(reversed(queries))
        for key, expr in order:
            raw[key].append(timed_query(prom, "/api/v1/query", query=expr, time=at))
            if ranged:
                got = timed_query(prom, "/api/v1/query_range", query=expr, start=at - 3600, end=at, step=15)
                raw[key][-1] = {"instant": raw[key][-1], "range": got}
    return raw


def stats(runs: list[dict[str, Any]]) -> dict[str, Any]:
    if any("error" in r for r in runs):
        return {"error": next(r["error"] for r in runs if "error" in r)}
    evals = [r["eval_s"] for r in runs]
    return {
        "median_s": median(evals),
        "max_s": max(evals),
        "wall_median_s": median([r["wall_s"] for r in runs]),
        "cpu_median_s": median([r["cpu_s"] for r in runs]),
        "series": runs[-1]["series"],
        "samples": runs[-1]["samples"],
    }


# -- checks -----------------------------------------------------------------------------------------------------


# The records this synthetic job gives no input (no GPM, tensor activity, TPU, skewed memory or straggler firing
# yet): empty here by design.
EMPTY_HERE = {
    "jaxmon:device_sm_active_ratio:workload",
    "jaxmon:device_speed:relative",  # one rule of three (sm_active) records nothing; its count is checked apart
    "jaxmon:device_tensor_active_ratio:clock_adjusted",
    "jaxmon:device_tensorcore_utilization_ratio:chip",
    "jaxmon:fleet_straggler:firing",
    "jaxmon:fleet_alerts:firing",  # the two stragglers' alerts are pending (for: 10m and 15m) while it measures
    # The job's heavy axis (model) is on its fast link (NVLink): no pair of axes to swap.
    "jaxmon:training_axis_swap_bytes_per_step",
    "jaxmon:training_axis_swap_seconds_saved_per_step",
    "jaxmon:training_axis_swap:best",
    # No process of the job restarted: job.yml leaves the restart terms absent (0) then.
    "jaxmon:training_disruption_seconds:increase5m",
    "jaxmon:training_redone_steps:increase5m",
    "jaxmon:training_redone_seconds:increase5m",
}


def check_answers(prom: Prometheus, job: Job, rules: list[str]) -> dict[str, Any]:
    """The rules' answer at scale: the straggler has the lowest host score, and only it is flagged."""
    n = job.n

    def count(expr: str) -> int:
        r = prom.query(f"count({expr})")
        return int(float(r[0]["value"][1])) if r else 0

    lowest = prom.query("bottomk(2, jaxmon:training_host_score)")
    lowest.sort(key=lambda s: float(s["value"][1]))
    alerts = prom.api("/api/v1/alerts")["data"]["alerts"]
    flagged = sorted(
        (a["labels"]["alertname"], a["state"], a["labels"].get("process_index") or a["labels"].get("device", "?"))
        for a in alerts
    )
    counts = {
        "jaxmon:training_step_seconds:mean5m": (count("jaxmon:training_step_seconds:mean5m"), n),
        "jaxmon:training_host_score": (count("jaxmon:training_host_score"), n),
        "jaxmon:training_step_score": (count("jaxmon:training_step_score"), n),
        "jaxmon:instance_workload:info": (count("jaxmon:instance_workload:info"), n),
        "jaxmon:device_speed:relative{signal=probe}": (count('jaxmon:device_speed:relative{signal="probe"}'), 8 * n),
        "jaxmon:device_speed:relative{signal=sm_clock}": (
            count('jaxmon:device_speed:relative{signal="sm_clock"}'),
            8 * n,
        ),
        "jaxmon:workload_device_memory_bytes:relative": (count("jaxmon:workload_device_memory_bytes:relative"), 8 * n),
    }
    records = sorted(
        {key.split("{")[0] for text in rules for _, key, _ in rule_expressions(text) if key.startswith("jaxmon:")}
    )
    empty = [r for r in records if count(r) == 0]
    fleet = {
        r["metric"]["workload"]: int(float(r["value"][1]))
        for r in prom.query('count by (workload) ({__name__=~"jaxmon:fleet_.+"})')
    }
    fleet_ok = list(fleet) == [WORKLOAD] and 0 < fleet[WORKLOAD] < 300
    # The host straggler (JaxmonTrainingStraggler) and the compute straggler (JaxmonTrainingComputeStraggler: the
    # host straggler's devices wait least in the collectives too, but its host wait explains it), each pending
    # (their `for:` is 10 and 15 minutes) or firing.
    expected = sorted(
        [
            ("JaxmonTrainingComputeStraggler", "pending", str(job.compute)),
            ("JaxmonTrainingStraggler", "pending", str(job.straggler)),
        ]
    )
    result = {
        "straggler": job.straggler,
        "lowest_host_score": [
            {"process_index": s["metric"].get("process_index"), "score": float(s["value"][1])} for s in lowest
        ],
        "alerts": [list(a) for a in flagged],
        "series_counts": {k: {"got": g, "expected": e} for k, (g, e) in counts.items()},
        "recording_rules_without_output": empty,
        "fleet_series_per_job": fleet,
    }
    lowest_ok = bool(lowest) and lowest[0]["metric"].get("process_index") == str(job.straggler)
    alerts_ok = [(name, process) for name, _, process in flagged] == [(name, p) for name, _, p in expected]
    counts_ok = all(g == e for g, e in counts.values())
    empty_ok = set(empty) <= EMPTY_HERE
    result["ok"] = lowest_ok and alerts_ok and counts_ok and empty_ok and fleet_ok
    print(
        f"  check: straggler is process {job.straggler}; lowest host score: "
        + ", ".join(f"process {s['process_index']} = {s['score']:.3f}" for s in result["lowest_host_score"])
        + f" -> {'OK' if lowest_ok else 'WRONG'}"
    )
    print(f"  check: alerts {flagged} -> {'OK' if alerts_ok else 'WRONG'} (expected {expected})")
    for k, (g, e) in counts.items():
        print(f"  check: count({k}) = {g} (expected {e}) -> {'OK' if g == e else 'WRONG'}")
    print(
        f"  check: records with no output: {empty} -> "
        + ("OK" if empty_ok else f"WRONG: {sorted(set(empty) - EMPTY_HERE)}")
    )
    print(f"  check: fleet series per job {fleet} -> {'OK' if fleet_ok else 'WRONG'} (under 300)")
    return result


# -- the dashboard ----------------------------------------------------------------------------------------------


def panel_queries(path: Path) -> list[tuple[str, str]]:
    """(panel title / refId, expr) of every target in the dashboard, rows' panels included."""
    doc = json.loads(path.read_text())
    out = []

    def walk(panels: list[dict[str, Any]]) -> None:
        for panel in panels:
            walk(panel.get("panels", []))
            for target in panel.get("targets", []):
                expr = target.get("expr")
                if expr and not target.get("hide"):
                    out.append((f"{panel.get('title', '?')} / {target.get('refId', '?')}", expr))

    walk(doc.get("panels", []))
    for row in doc.get("rows", []):  # the old schema
        walk(row.get("panels", []))
    return out


def substitute(expr: str, variables: dict[str, str]) -> tuple[str, list[str]]:
    """Grafana's $var, ${var} and ${var:fmt} replaced; the names it did not know."""
    unknown: list[str] = []

    def one(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2) or m.group(3)
        if name in variables:
            return variables[name]
        unknown.append(name)
        return ".*"

    out = re.sub(r"\$\{(\w+)(?::\w+)?\}|\[\[(\w+)\]\]|\$(\w+)", one, expr)
    return out, unknown


def time_label_values(prom: Prometheus, path: Path, rounds: int, at: float) -> dict[str, Any]:
    """The dashboard's label_values(metric, label) variables as Grafana asks for them (the label values API with
    match[], over the last hour): wall time, median of `rounds`."""
    out: dict[str, Any] = {}
    for var in json.loads(path.read_text()).get("templating", {}).get("list", []):
        query = var.get("query")
        query = query.get("query", "") if isinstance(query, dict) else str(query or "")
        m = re.fullmatch(r"\s*label_values\((.+),\s*(\w+)\)\s*", query) if var.get("type") == "query" else None
        if not m:
            continue
        walls, values = [], 0
        for _ in range(rounds):
            started = time.perf_counter()
            r = requests.get(
                f"{prom.url}/api/v1/label/{m.group(2)}/values",
                params={"match[]": m.group(1), "start": at - 3600, "end": at},
                timeout=300,
            )
            walls.append(time.perf_counter() - started)
            values = len(r.json().get("data") or [])
        out[var["name"]] = {"query": query, "wall_median_s": median(walls), "wall_max_s": max(walls), "values": values}
    return out


def dashboard_variables(path: Path, job: Job) -> dict[str, str]:
    variables = {
        "workload": WORKLOAD,
        "job": JOB,
        "__rate_interval": "1m",
        "__interval": "15s",
        "__interval_ms": "15000",
        "__range": "1h",
        "__range_s": "3600",
        "__range_ms": "3600000",
        "process_index": ".*",
        "instance": ".*",
        "host": ".*",
        "device": ".*",
        "datasource": "prometheus",
    }
    doc = json.loads(path.read_text())
    for var in doc.get("templating", {}).get("list", []):
        name = var.get("name")
        if name and name not in variables and var.get("type") in ("constant", "interval", "custom", "textbox"):
            current = var.get("current", {}).get("value") or var.get("query", "")
            if isinstance(current, list):
                current = "|".join(current)
            variables[name] = str(current).split(",")[0]
    return variables


# -- (b): the series per host -----------------------------------------------------------------------------------

CHILD = r"""
import os, sys, time
os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec
import jaxmon

exporter = jaxmon.start(0, workload="budget", poll={"interval": 0.5}, training={"peak_flops": 1e12},
                        collector={"probe": {"interval": "2s"},
                                   "training": {"profile": {"every": 8, "steps": 2, "min_seconds": 0}}})
print("URL", exporter.url, flush=True)
mesh = Mesh(np.array(jax.devices()), ("d",))
batch = NamedSharding(mesh, PartitionSpec("d"))
rng = np.random.default_rng(0)
x = jax.device_put(rng.standard_normal((1024, 64), dtype=np.float32), batch)
y = jax.device_put(rng.standard_normal((1024, 1), dtype=np.float32), batch)
params = {"w": jnp.zeros((64, 1)), "b": jnp.zeros((1,))}

def loss(p, x, y):
    return jnp.mean((x @ p["w"] + p["b"] - y) ** 2)

@jax.jit
def step(p, x, y):
    return jax.tree.map(lambda a, g: a - 0.01 * g, p, jax.grad(loss)(p, x, y))

tracked = jaxmon.track(step)
for n in range(STEPS):
    with jaxmon.badput("data"):
        time.sleep(0.005)
    params = tracked(params, x, y)
    jaxmon.step(n, params["b"], examples=1024, tokens=1024 * 512, model_flops=8e9)
    if n % 10 == 9:
        with jaxmon.badput("checkpoint"):
            time.sleep(0.01)
        with jaxmon.badput("eval"):
            time.sleep(0.01)
jax.block_until_ready(params)
print("DONE", flush=True)
sys.stdin.read()
exporter.stop()
"""
BUDGET_STEPS = 40


def _scrape_child(devices: int, nvml_env: dict[str, str] | None) -> tuple[str, str]:
    """A real embedded exporter's /metrics, in the text format and in OpenMetrics, once CHILD stepped, a sampled
    trace was read and the probe ran (`devices` JAX CPU devices; NVML's fake GPUs when `nvml_env`)."""
    env = {**os.environ, "JAX_NUM_CPU_DEVICES": str(devices), "PYTHONUNBUFFERED": "1", **(nvml_env or {})}
    code = CHILD.replace("STEPS", str(BUDGET_STEPS))
    proc = subprocess.Popen(
        [PY, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, cwd=ROOT, text=True
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().split()[1]
        assert proc.stdout.readline().strip() == "DONE"

        def complete() -> bool:
            s = parse_samples(requests.get(url + "/metrics", timeout=10).text)
            steps = [v for (n, _), v in s.items() if n == "jaxmon_training_steps_total"]
            probed = {dict(k)["device"] for n, k in s if n == "jaxmon_probe_flops_per_second"}
            sampled = any(n == "jaxmon_training_profile_sample_step" for n, _ in s)
            return steps == [BUDGET_STEPS] and len(probed) > 0 and sampled  # on CPU the probe runs on one device

        wait_until(complete, 120, "every step seen, a sampled trace and a probe run", step=0.5)
        text = requests.get(url + "/metrics", timeout=10).text
        om = requests.get(url + "/metrics", headers={"Accept": "application/openmetrics-text"}, timeout=10).text
        return text, om
    finally:
        proc.kill()
        proc.wait()


def _series(text: str) -> int:
    return sum(1 for line in text.splitlines() if line and not line.startswith("#"))


def per_host_budget(job: Job) -> dict[str, Any]:
    """Count the series of a real embedded exporter on 1 and on 8 devices (text and OpenMetrics, whose `_created`
    lines Prometheus keeps as series of their own), its training series on 8; check the synthetic labels against
    it."""
    sys.path.insert(0, str(ROOT))
    from tests.fakenvml import Scenario, build, device

    with tempfile.TemporaryDirectory(prefix="jaxmon-budget-") as tmp:
        nvml = True
        try:
            build()
            nvml_env = Scenario(Path(tmp) / "scenario.json", [device(i) for i in range(DEVICES)]).env()
        except AssertionError as exc:  # no gcc: the NVML labels go unchecked
            print(f"  (no fake NVML: {exc})")
            nvml, nvml_env = False, None
        text, om = _scrape_child(DEVICES, nvml_env)
        one_text, one_om = _scrape_child(1, None)
        many_text, many_om = _scrape_child(DEVICES, None)
    # Without NVML, series = a + b x devices: a the process's, b each device's.
    counts = {"text": (_series(one_text), _series(many_text)), "openmetrics": (_series(one_om), _series(many_om))}
    by_mode = {
        fmt: {"1 device": c1, f"{DEVICES} devices": c8, "per_device": (c8 - c1) / (DEVICES - 1)}
        for fmt, (c1, c8) in counts.items()
    }
    created = sum(1 for line in many_om.splitlines() if line.split("{")[0].split(" ")[0].endswith("_created"))
    print(f"  embedded, CPU devices, no NVML: {by_mode}; _created series on {DEVICES} devices: {created}")
    samples = parse_samples(text)
    budget: dict[str, int] = {}
    for name, _ in samples:
        if name.startswith("jaxmon_training_") or name in (
            "jaxmon_device_peak_flops_per_second",
            "jaxmon_workload_info",
        ):
            family = re.sub(r"_(bucket|count|sum|total)$", "", name)
            budget[family] = budget.get(family, 0) + 1
    # The synthetic job's label names, family by family, against the real exporter's.
    real: dict[str, set[frozenset[str]]] = {}
    for name, labels in samples:
        keys = frozenset(k for k, _ in labels)
        source = dict(labels).get("source")
        real.setdefault(name + (f"/{source}" if name == "jaxmon_device_info" else ""), set()).add(keys)
    real["jaxmon_memory_bytes_in_use"] = real.get("jaxmon_memory_live_array_bytes", set())  # CPU: no allocator
    mismatches = []
    for fam in job.families():
        # Records (backfilled) are no exporter's; CPU devices have no nominal link bandwidth (the table's kinds).
        if not fam.live or fam.name == "jaxmon_link_nominal_bandwidth_bytes_per_second":
            continue
        for pre in fam.prefixes(0):
            name, rest = pre.split("{", 1)
            labels = dict(re.findall(r'(\w+)="([^"]*)"', rest))
            keys = frozenset(labels) - {"job", "instance"}
            key = name + (f"/{labels['source']}" if name == "jaxmon_device_info" else "")
            if key not in real and not nvml and labels.get("source") == "nvml":
                continue
            if keys not in real.get(key, set()):
                mismatches.append(f"{key}: synthetic {sorted(keys)}, real {[sorted(k) for k in real.get(key, ())]}")
    mismatches = sorted(set(mismatches))
    total = sum(budget.values())
    print(f"  per host (1 process, 8 devices): {total} training series: {budget}")
    print(f"  synthetic labels match the exporter's: {mismatches or 'yes'}")
    return {
        "series": total,
        "by_family": dict(sorted(budget.items())),
        "steps": BUDGET_STEPS,
        "badput_kinds": sorted(dict(k)["kind"] for n, k in samples if n == "jaxmon_training_badput_seconds_total"),
        "nvml_labels_checked": nvml,
        "label_mismatches": mismatches,
        "synthetic_series_per_process": sum(f.per_process for f in job.families() if f.live),
        "embedded_series": by_mode,
        "created_series_8_devices": created,
        "with_nvml_8_gpus": {"text": _series(text), "openmetrics": _series(om)},
    }


# -- one job size -----------------------------------------------------------------------------------------------


@contextlib.contextmanager
def workdir(keep: bool) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="jaxmon-job-rules-", dir=os.environ.get("TMPDIR", "/var/tmp")))
    try:
        yield path
    finally:
        if keep:
            print(f"  kept {path}")
        else:
            shutil.rmtree(path, ignore_errors=True)


def tsdb_blocks(data: Path) -> list[dict[str, Any]]:
    out = []
    for meta in sorted(data.glob("*/meta.json")):
        m = json.loads(meta.read_text())
        out.append(
            {
                "ulid": m["ulid"],
                "min_time": m["minTime"] / 1e3,
                "max_time": m["maxTime"] / 1e3,
                "series": m["stats"]["numSeries"],
                "samples": m["stats"]["numSamples"],
                "bytes": sum(f.stat().st_size for f in meta.parent.rglob("*") if f.is_file()),
            }
        )
    return out


def one_size(n: int, args: argparse.Namespace) -> dict[str, Any]:
    print(f"== {n} processes x {DEVICES} GPUs")
    with workdir(args.keep) as work:
        data = work / "data"
        data.mkdir()
        start = time.time()
        history_from = start - LONG_HISTORY * 60
        job = Job(n, history_from - 1200, args.seed)
        fams = job.families()
        series = n * sum(f.per_process for f in fams if f.live)
        print(
            f"  {series:,} series ({series // n} per process); stragglers: process {job.straggler} (host), "
            f"process {job.compute} (compute)"
        )
        history = {
            "hour": backfill(job, work, data, "hour", history_from, start, start, hour=True),
            "minutes": backfill(job, work, data, "minutes", history_from, start, start, hour=False),
        }
        # The minutes the backfill took, until what is left is under a minute and a half.
        gaps: list[dict[str, Any]] = []
        gap_from, gap_to = start, time.time()
        while gap_to - gap_from > 90 or not gaps:
            gaps.append(backfill(job, work, data, f"gap{len(gaps)}", gap_from, gap_to, start))
            gap_from, gap_to = gap_to, time.time()
        gap = {"passes": gaps}
        blocks = tsdb_blocks(data)

        shards = [slice(p, min(n, p + args.shard)) for p in range(0, n, args.shard)]
        port = free_port()
        server = multiprocessing.get_context("fork").Process(target=serve, args=(job, port, shards), daemon=True)
        server.start()
        try:
            wait_until(lambda: _answers(port), 120, "the synthetic target", step=0.5)
            prom = Prometheus(work, data, args.rules, args.fleet, port, len(shards), f"job-rules-prometheus-{n}")
            started = [prom]
            try:
                return measure(prom, job, n, args, series, history, gap, blocks, start, gap_to, started)
            finally:
                for each in started:
                    each.child.stop(timeout=120)
        finally:
            server.terminate()
            server.join(10)


def _answers(port: int) -> bool:
    with contextlib.suppress(requests.RequestException):
        return requests.get(f"http://127.0.0.1:{port}/metrics/0", timeout=30).status_code == 200
    return False


def measure(
    prom: Prometheus,
    job: Job,
    n: int,
    args: argparse.Namespace,
    series: int,
    history: dict[str, Any],
    gap: dict[str, Any],
    blocks: list[dict[str, Any]],
    start: float,
    gap_to: float,
    started: list[Prometheus],
) -> dict[str, Any]:
    ready_at = time.time()
    # An evaluation's 5 m windows reach into the backfilled blocks until LOOKBACK after their end; in a running
    # Prometheus the last hours are in the head, so only evaluations after that count (the others are kept apart).
    steady_from = max(b["max_time"] for b in blocks) + LOOKBACK + INTERVAL
    print(
        f"  prometheus ready {ready_at - gap_to:.0f} s after the backfill's end; recording evaluations until "
        f"{args.evals} of each group start after the blocks leave the 5 m window ({steady_from - ready_at:.0f} s)"
    )
    loadavg_before = [round(x, 2) for x in os.getloadavg()]
    n_groups = len(yaml.safe_load(args.rules)["groups"]) + len(yaml.safe_load(args.fleet)["groups"])
    collected = collect_evaluations(prom, n_groups, args.evals, steady_from)
    groups = summarise(collected["rounds"], steady=True)
    warmup = summarise(collected["rounds"], steady=False)
    for name, g in groups.items():
        w = warmup.get(name)
        before = (
            f" (with a block in the window: median {w['median_s'] * 1e3:.1f} ms, {w['evaluations']} evals)" if w else ""
        )
        print(f"  group {name}: median {g['median_s'] * 1e3:.1f} ms, max {g['max_s'] * 1e3:.1f} ms{before}")
    if collected["problems"]:
        print(f"  rule problems: {collected['problems']}")
    m = prom.metrics()
    summary = {
        dict(k).get("quantile", n_): v
        for (n_, k), v in m.items()
        if n_.startswith("prometheus_rule_evaluation_duration_seconds")
    }
    missed = sum(v for (n_, _), v in m.items() if n_ == "prometheus_rule_group_iterations_missed_total")
    failures = sum(v for (n_, _), v in m.items() if n_ == "prometheus_rule_evaluation_failures_total")
    head_series = next((v for (n_, _), v in m.items() if n_ == "prometheus_tsdb_head_series"), None)
    compactions = next((v for (n_, _), v in m.items() if n_ == "prometheus_tsdb_compactions_total"), None)
    scrapes = prom.query('scrape_duration_seconds{job="synthetic"}')
    scraped = prom.query('sum(scrape_samples_scraped{job="synthetic"})')
    up = prom.query('sum(up{job="synthetic"})')

    answers = check_answers(prom, job, [args.rules, args.fleet])
    rss = prom.rss()

    # Each expression alone, at the last evaluations' time, in a Prometheus that does nothing else (the same TSDB,
    # no rules, nothing scraped): its CPU time is the query's, whatever else this machine runs beside it.
    at = round(time.time() - 5, 3)
    prom.child.stop(timeout=120)  # its head written to the WAL, which the quiet one replays
    replay = time.monotonic()
    prom = Prometheus(prom.work, prom.data, "", "", 0, 0, f"job-rules-quiet-{n}", quiet=True)
    started.append(prom)
    replayed = round(time.monotonic() - replay, 1)
    idle = prom.wait_idle()
    exprs = [(key, expr) for text in (args.rules, args.fleet) for _, key, expr in rule_expressions(text)]
    print(
        f"  timing {len(exprs)} rule expressions alone, {args.rounds} rounds (a quiet Prometheus, up in {replayed} s, "
        f"idle after {idle} s)"
    )
    raw_rules = time_queries(prom, exprs, args.rounds, at, ranged=False)
    rules_alone = {key: stats(runs) for key, runs in raw_rules.items()}
    for key, s in sorted(rules_alone.items(), key=lambda kv: -kv[1].get("cpu_median_s", 0))[:6]:
        print(
            f"    {key}: {s.get('median_s', 0) * 1e3:.1f} ms, CPU {s.get('cpu_median_s', 0) * 1e3:.0f} ms "
            f"({s.get('series')} series, {s.get('samples')} samples)"
        )
    # A group's cost on a core of its own: the CPU time of its rules alone, added.
    group_cpu = {
        group: sum(rules_alone[key].get("cpu_median_s", 0.0) for g, key, _ in keys if g == group)
        for text in (args.rules, args.fleet)
        for keys in [rule_expressions(text)]
        for group in {g for g, _, _ in keys}
    }
    for group, cpu in sorted(group_cpu.items(), key=lambda kv: -kv[1])[:8]:
        print(f"    group {group}: its rules' CPU {cpu * 1e3:.0f} ms")

    dashboard: dict[str, Any]
    if args.dashboard.exists():
        variables = dashboard_variables(args.dashboard, job)
        queries, unknown = [], set()
        for key, expr in panel_queries(args.dashboard):
            sub, missing = substitute(expr, variables)
            unknown.update(missing)
            queries.append((key, sub))
        print(f"  timing {len(queries)} dashboard queries, {args.rounds} rounds (instant and 1 h at 15 s)")
        raw_dash = time_queries(prom, queries, args.rounds, at, ranged=True)
        label_values = time_label_values(prom, args.dashboard, args.rounds, at)
        dashboard = {
            "path": str(args.dashboard),
            **version(args.dashboard),
            "variables": variables,
            "unknown_variables": sorted(unknown),
            "queries": {
                key: {
                    "expr": expr,
                    "instant": stats([r["instant"] for r in raw_dash[key]]),
                    "range": stats([r["range"] for r in raw_dash[key]]),
                }
                for key, expr in queries
            },
            "variable_queries": label_values,
            "raw": raw_dash,
        }
        for key, q in sorted(dashboard["queries"].items(), key=lambda kv: -kv[1]["range"].get("median_s", 0))[:5]:
            print(f"    {key}: instant {q['instant']}, range {q['range']}")
    else:
        print(f"  no dashboard at {args.dashboard}: its queries are not measured")
        dashboard = {"path": str(args.dashboard), "measured": False}

    return {
        "processes": n,
        "devices_per_process": DEVICES,
        "series": series,
        "straggler": job.straggler,
        "data": {
            "history_minutes": {"hour_families": LONG_HISTORY, "others": SHORT_HISTORY},
            "history": history,
            "gap": gap,
            "blocks": blocks,
            "live_shards": math.ceil(n / args.shard),
            "prometheus_ready_after_backfill_s": round(ready_at - gap_to, 1),
            "scrape_duration_s": sorted(round(float(s["value"][1]), 3) for s in scrapes),
            "samples_scraped": float(scraped[0]["value"][1]) if scraped else None,
            "targets_up": float(up[0]["value"][1]) if up else None,
            "head_series": head_series,
            "compactions": compactions,
        },
        "loadavg_before_evaluations": loadavg_before,
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "prometheus_rss_bytes": rss,
        "groups": groups,
        "groups_with_a_block_in_the_window": warmup,
        "steady_from": steady_from,
        "goal_group_under_s": GROUP_GOAL_S,
        "goal_met": all(g["max_s"] < GROUP_GOAL_S for g in groups.values()),
        "group_cpu_s": group_cpu,
        "goal_met_by_cpu": all(cpu < GROUP_GOAL_S for cpu in group_cpu.values()),
        "rule_evaluation_duration_seconds": summary,
        "iterations_missed": missed,
        "evaluation_failures": failures,
        "rule_problems": collected["problems"],
        "answers": answers,
        "rules_alone": rules_alone,
        "dashboard": dashboard,
        "raw": {
            "evaluations": collected["rounds"],
            "last_duration_metric": collected["last_duration_metric"],
            "rules_alone": raw_rules,
        },
    }


def git(*args: str) -> str:
    return subprocess.run(["git", *args], capture_output=True, text=True, cwd=ROOT).stdout.strip()


def version(path: Path) -> dict[str, Any]:
    """The blob measured, and whether it is the committed one (others edit the tree while this runs)."""
    if not path.exists():
        return {"exists": False}
    changed = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", str(path)], cwd=ROOT).returncode != 0
    return {
        "blob": git("hash-object", str(path)),
        "last_commit": git("log", "-1", "--format=%h", "--", str(path)),
        "uncommitted_changes": changed,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--processes", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--evals", type=int, default=16, help="evaluations of every group to record (15 s apart)")
    ap.add_argument("--rounds", type=int, default=5, help="rounds of each query")
    ap.add_argument("--dashboard", type=Path, default=DASHBOARD)
    ap.add_argument("--shard", type=int, default=256, help="processes per live scrape target")
    ap.add_argument("--seed", type=int, default=21)
    ap.add_argument("--rules", type=Path, default=RULES, help="the rules file to measure (a candidate for job.yml)")
    ap.add_argument("--fleet", type=Path, default=FLEET_RULES, help="the fleet rules loaded beside it (fleet.yml)")
    ap.add_argument("--no-budget", action="store_true", help="skip (b), the per-host series count")
    ap.add_argument("--keep", action="store_true", help="keep the TSDB and the configs (printed)")
    ap.add_argument("--out-name", default="job_rules_scale")
    args = ap.parse_args()
    args.dashboard = args.dashboard if args.dashboard.is_absolute() else (Path.cwd() / args.dashboard)
    rules_path = args.rules.resolve()
    args.rules = rules_path.read_text()
    fleet_path = args.fleet.resolve()
    args.fleet = fleet_path.read_text()
    started = time.time()
    result: dict[str, Any] = {
        "command": " ".join(sys.argv[1:]),
        "started": started,
        "commit": git("rev-parse", "HEAD"),
        "rules": {"path": str(rules_path), **version(rules_path)},
        "fleet_rules": {"path": str(fleet_path), **version(fleet_path)},
        "dashboard": {"path": str(args.dashboard), **version(args.dashboard)},
        "prometheus": subprocess.run(["prometheus", "--version"], capture_output=True, text=True).stdout.split("\n")[0],
    }
    if not args.no_budget:
        print("== the series a host adds for training (real embedded exporter, 8 devices)")
        result["per_host"] = per_host_budget(Job(1, started))
    result["sizes"] = [one_size(n, args) for n in args.processes]
    result["seconds"] = round(time.time() - started)
    RESULTS.mkdir(parents=True, exist_ok=True)
    save(args.out_name, result)


if __name__ == "__main__":
    main()
