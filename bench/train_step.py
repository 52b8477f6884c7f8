"""Training-step time of a small JAX loop on CPU with the embedded exporter on vs off (A/B interleaved, median).

    .venv/bin/python bench/train_step.py           # about 2 minutes

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

    def __init__(self, mode: str) -> None:
        self.mode = mode
        RESULTS.mkdir(parents=True, exist_ok=True)
        super().__init__(RESULTS, mode, "--interval", "5", env=base_env())

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=12, help="rounds per mode")
    ap.add_argument("--steps", type=int, default=40000, help="steps per round")
    args = ap.parse_args()

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
