"""Training-step time of a small JAX loop on CPU: the embedded exporter on vs off, and jaxmon.step() every step vs
none (A/B interleaved, medians).

    .venv/bin/python bench/train_step.py                 # both, about 4 minutes
    .venv/bin/python bench/train_step.py --what step     # jaxmon.step() only, about 2 minutes

The step part (issue 20) runs one embedded trainer (the probe off, so that only step() differs) through
`loop N 0|1 SIZE` of tests/workloads/train.py: an asynchronous loop of N steps of a SIZE x SIZE matmul (synced only
at the end, as a training loop that lets the host run ahead), without and with `jaxmon.step(n, loss)` every step,
in alternating rounds. It reports the throughput difference at SIZE 1024 (about 5 ms a step on these 2 cores) and
256 (about 0.15 ms: the overhead per step in microseconds shows there), and the median time of one step() call on
the training thread. Targets: throughput within 1 % at a step of milliseconds, step() <= 20 us median. On CPU
devices the waiter thread shares the cores that compute the steps, the worst case for its cost.
Last, `cpu 5000 0|1` (tiny steps, each synced, 0.3 ms of sleep between them) in 6 alternating rounds: this
process's CPU per step without and with step(), so jaxmon's own CPU (step() and the waiter) with the cores free.

Two copies of tests/workloads/train.py run side by side on 8 JAX CPU devices: `none` (no exporter) and
`embedded` (`jaxmon.start()` at the default poll interval of 5 s, probes every 15 s on all 8 devices, which on
CPU share the 2 cores with training). While one trains (`train N`, N steps of a small jit-compiled SGD step),
the other is stopped with SIGSTOP, so neither measures the other's background threads; while the embedded one
trains, this script scrapes its /metrics once a second, as Prometheus would. Rounds alternate A B, B A, ...
Each round gives the median step time (train.py's answer) and the mean (wall time of the round / N). The figure
is the median over rounds of the per-round medians; the mean, which includes the exporter's periodic work
amortised over the steps, is reported beside it. Target: embedded <= 1 % slower.
"""

from __future__ import annotations

import argparse
import http.client
import signal
import subprocess
import threading
import time
from typing import Any

from common import RESULTS, all_calibrated, base_env, median, save, wait_for

from tests.helpers import Child


class Trainer(Child):
    """tests/workloads/train.py in one mode, driven line by line (tests/helpers.py's Child), stderr in results/."""

    def __init__(self, mode: str, probe: bool = True) -> None:
        self.mode = mode
        RESULTS.mkdir(parents=True, exist_ok=True)
        env = base_env() if probe else {**base_env(), "JAXMON_COLLECTOR__PROBE": "false"}
        super().__init__(RESULTS, mode, "--interval", "5", env=env)

    def command(self, text: str) -> dict[str, Any]:
        return self.send(text)

    def pause(self) -> None:
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        self.resume()
        try:
            self.command("exit")
            self.proc.wait(15)
        except (AssertionError, OSError, subprocess.TimeoutExpired):
            pass
        self.close()


class Scraper(threading.Thread):
    """Scrapes the embedded exporter once a second, only while `active` is set."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        host, port = url.removeprefix("http://").split(":")
        self.host, self.port = host, int(port)
        self.active = threading.Event()
        self.idle = threading.Event()
        self.idle.set()
        self.count = 0

    def run(self) -> None:
        while True:
            self.active.wait()
            self.idle.clear()
            try:
                conn = http.client.HTTPConnection(self.host, self.port, timeout=5)
                conn.request("GET", "/metrics", headers={"Accept-Encoding": "gzip"})
                conn.getresponse().read()
                conn.close()
                self.count += 1
            except OSError:
                pass
            finally:
                self.idle.set()
            time.sleep(1.0)

    def pause(self) -> None:
        self.active.clear()
        self.idle.wait(10)


def wait_calibrated(url: str, timeout: float = 120.0) -> None:
    wait_for(url, all_calibrated(), timeout=timeout, what="embedded probes calibrated")


def step_overhead(rounds: int) -> dict[str, Any]:
    """jaxmon.step() every step vs none, in one embedded trainer, at two step sizes; then jaxmon's CPU per step
    (step() and the waiter) on a loop that leaves the cores free."""
    trainer = Trainer("embedded", probe=False)
    out: dict[str, Any] = {}
    try:
        for size, steps in ((1024, 400), (256, 4000)):
            trainer.command(f"loop 50 0 {size}")  # compile and warm up
            trainer.command(f"loop 50 1 {size}")
            walls: dict[str, list[float]] = {"without": [], "with": []}
            calls: list[float] = []
            for i in range(rounds):
                for name in ("without", "with") if i % 2 == 0 else ("with", "without"):
                    answer = trainer.command(f"loop {steps} {1 if name == 'with' else 0} {size}")
                    walls[name].append(float(answer["wall"]))
                    if answer["step_call_ns"] is not None:
                        calls.append(float(answer["step_call_ns"]))
            per_step = {k: median(v) / steps for k, v in walls.items()}
            paired = [100 * (a / b - 1) for a, b in zip(walls["with"], walls["without"], strict=True)]
            out[str(size)] = {
                "steps_per_round": steps,
                "step_s": per_step,
                "slower_percent": 100 * (per_step["with"] / per_step["without"] - 1),
                "slower_percent_paired_median": median(paired),
                "overhead_per_step_us": 1e6 * (per_step["with"] - per_step["without"]),
                "step_call_median_us": median(calls) / 1000,
                "rounds_detail": walls,
            }
            print(
                f"size {size}: step {per_step['without'] * 1e3:.3f} ms -> {per_step['with'] * 1e3:.3f} ms with "
                f"step() ({out[str(size)]['slower_percent']:+.2f} %, paired {median(paired):+.2f} %), "
                f"step() call {median(calls) / 1000:.2f} us median",
                flush=True,
            )
        cpu: dict[str, list[float]] = {"without": [], "with": []}
        for i in range(6):
            for name in ("without", "with") if i % 2 == 0 else ("with", "without"):
                answer = trainer.command(f"cpu 5000 {1 if name == 'with' else 0}")
                cpu[name].append(float(answer["cpu_per_step_us"]))
        per = {k: median(v) for k, v in cpu.items()}
        out["cpu_per_step_us"] = {**per, "jaxmon": per["with"] - per["without"], "rounds_detail": cpu}
        print(f"CPU per step: {per['without']:.1f} us -> {per['with']:.1f} us with step()", flush=True)
    finally:
        trainer.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=12, help="rounds per mode")
    ap.add_argument("--steps", type=int, default=40000, help="steps per round")
    ap.add_argument("--what", choices=["exporter", "step", "both"], default="both")
    args = ap.parse_args()
    if args.what in ("step", "both"):
        result = step_overhead(args.rounds)
        big = result["1024"]
        met = big["slower_percent"] <= 1 and big["step_call_median_us"] <= 20
        command = f"python bench/train_step.py --what {args.what} --rounds {args.rounds}"
        save("train_step_call", {"command": command, **result, "met": met})
    if args.what == "step":
        return

    off = Trainer("none")
    on = Trainer("embedded")
    trainers = {"off": off, "on": on}
    results: dict[str, list[dict[str, float]]] = {"off": [], "on": []}
    scraper = Scraper(str(on.hello["url"]))
    try:
        wait_calibrated(str(on.hello["url"]))
        for t in trainers.values():
            t.command("train 2000")  # compile and warm up
        scraper.start()
        for i in range(args.rounds):
            order = ["off", "on"] if i % 2 == 0 else ["on", "off"]
            for name in order:
                me, other = trainers[name], trainers["on" if name == "off" else "off"]
                if other is on:
                    scraper.pause()
                other.pause()
                me.resume()
                if me is on:
                    scraper.active.set()
                t0 = time.perf_counter()
                answer = me.command(f"train {args.steps}")
                wall = time.perf_counter() - t0
                results[name].append({"median_s": float(answer["median"]), "mean_s": wall / args.steps})
                print(
                    f"round {i} exporter {name:3}: median {answer['median'] * 1e6:7.2f} us"
                    f"  mean {wall / args.steps * 1e6:7.2f} us",
                    flush=True,
                )
    finally:
        scraper.pause()
        for t in trainers.values():
            t.stop()

    med = {k: median([r["median_s"] for r in v]) for k, v in results.items()}
    mean = {k: median([r["mean_s"] for r in v]) for k, v in results.items()}
    slower_median = 100 * (med["on"] / med["off"] - 1)
    slower_mean = 100 * (mean["on"] / mean["off"] - 1)
    paired = [100 * (a["median_s"] / b["median_s"] - 1) for a, b in zip(results["on"], results["off"], strict=True)]
    print(
        f"median step: off {med['off'] * 1e6:.2f} us, on {med['on'] * 1e6:.2f} us -> {slower_median:+.2f} %"
        f" (paired rounds median {median(paired):+.2f} %); mean step {slower_mean:+.2f} %"
        f" -> {'met' if slower_median <= 1 else 'MISSED'}"
    )
    save(
        "train_step",
        {
            "command": "python bench/train_step.py",
            "steps_per_round": args.steps,
            "rounds": args.rounds,
            "scrapes_of_embedded": scraper.count,
            "median_step_s": med,
            "mean_step_s": mean,
            "slower_percent_median": slower_median,
            "slower_percent_paired_median": median(paired),
            "slower_percent_mean": slower_mean,
            "met": slower_median <= 1,
            "rounds_detail": results,
        },
    )


if __name__ == "__main__":
    main()
