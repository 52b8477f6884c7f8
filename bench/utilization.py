"""Utilization estimate against induced load on CPU devices: 0 %, ~50 %, ~100 % of the device kept busy.

    .venv/bin/python bench/utilization.py          # about 5 minutes
    python bench/utilization.py --platform gpu --size 4096 --load-devices 1 --passes 1   # on a GPU (bench/gpu.sh)

`jaxmon serve` on 8 JAX CPU devices, defaults except `--collector.probe.interval 2s` (more probe runs per window; the
estimate does not depend on the interval). After its probes calibrate on an idle machine, another process (this
script with --load) keeps JAX CPU devices busy with a duty cycle: in every 200 ms period it runs `tanh(x @ x)`
on 256 x 256 float32 back to back on each of its 8 CPU devices (one thread per device) for duty x 200 ms, then
sleeps. It measures its own duty cycle (the share of wall time it had work in flight). Windows of 30 s at 0 %,
50 %, 100 %, then again in reverse order; every probe run in a window is one sample of
jaxmon_device_utilization_ratio (read from /metrics every 0.2 s, a sample per new jaxmon_probe_runs_total).
The figure is the mean estimate per level against the induced duty. Target: within 10 points.

CPU caveat: all 8 CPU devices of both processes are threads on the same 2 cores, scheduled by the kernel's fair
scheduler. A "busy" device does not make the probe wait for the device, as a GPU queue does; it makes the probe's
threads share cores with the load's threads. So at 100 % load the probe still gets its fair share of the cores
and runs slower by that share, not by the load's duty cycle. See BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time

from common import (
    PY,
    Jaxmon,
    all_calibrated,
    base_env,
    cpu_seconds,
    median,
    per_device,
    running,
    save,
    scrape,
    wait_for,
    wait_ready,
)

PERIOD = 0.2


def load(duty: float, devices: int, size: int, platform: str) -> None:
    """The load process: busy `duty` of every PERIOD on `devices` CPU devices; prints its measured duty."""
    os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")
    import jax
    import jax.numpy as jnp
    import numpy as np

    fn = jax.jit(lambda x: jnp.tanh(x @ x) * 0.5)
    xs = [
        jax.device_put(np.random.default_rng(i).random((size, size), dtype=np.float32), d)
        for i, d in enumerate(jax.devices(platform)[:devices])
    ]
    for x in xs:
        fn(x).block_until_ready()
    busy = [0.0]
    lock = threading.Lock()
    started = time.monotonic()
    # One clock for all threads: each period's busy part starts at the same instant on every device.

    def worker(x: object) -> None:
        while True:
            now = time.monotonic()
            period_start = started + ((now - started) // PERIOD) * PERIOD
            busy_until = period_start + duty * PERIOD
            t0 = time.monotonic()
            while time.monotonic() < busy_until:
                fn(x).block_until_ready()
            with lock:
                busy[0] += time.monotonic() - t0
            time.sleep(max(period_start + PERIOD - time.monotonic(), 0.0))

    if duty > 0:
        for x in xs:
            threading.Thread(target=worker, args=(x,), daemon=True).start()
    print("READY", flush=True)
    last_busy, last_t = 0.0, time.monotonic()
    while True:
        time.sleep(5)
        now = time.monotonic()
        with lock:
            b = busy[0]
        # per device: busy time summed over the device threads / (devices x wall)
        print(f"DUTY {(b - last_busy) / (len(xs) * (now - last_t)):.4f}", flush=True)
        last_busy, last_t = b, now


def window(daemon: Jaxmon, duty: float, seconds: float, args: argparse.Namespace) -> dict[str, float]:
    argv = [PY, __file__, "--load", str(duty), "--load-devices", str(args.load_devices), "--size", str(args.size)]
    # On a GPU the load must leave room for the daemon's own (non-preallocating) client.
    env = base_env(XLA_PYTHON_CLIENT_PREALLOCATE="false", XLA_CLIENT_MEM_FRACTION="0.3")
    env.pop("XLA_PYTHON_CLIENT_MEM_FRACTION", None)
    proc = subprocess.Popen([*argv, "--platform", args.platform], stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    try:
        while proc.stdout.readline().strip() != "READY":
            if proc.poll() is not None:
                raise RuntimeError("load process exited")
        cpu0 = cpu_seconds(proc.pid)
        time.sleep(1.0)
        seen = per_device(scrape(daemon.url), "jaxmon_probe_runs_total", args.platform)
        estimates: list[float] = []
        t0 = time.monotonic()
        while time.monotonic() - t0 < seconds:
            s = scrape(daemon.url)
            runs = per_device(s, "jaxmon_probe_runs_total", args.platform)
            util = per_device(s, "jaxmon_device_utilization_ratio", args.platform)
            for d, n in runs.items():
                if n != seen.get(d) and d in util:
                    estimates.append(util[d])
            seen = runs
            time.sleep(0.2)
        cores = (cpu_seconds(proc.pid) - cpu0) / (time.monotonic() - t0 + 1.0)
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=10)
    duties = [float(line.split()[1]) for line in out.splitlines() if line.startswith("DUTY")]
    measured = median(duties[1:] or duties) if duties else 0.0
    return {
        "target_duty": duty,
        "measured_duty": measured,
        "load_cores_used": cores,
        "samples": len(estimates),
        "mean_estimate": sum(estimates) / len(estimates) if estimates else float("nan"),
        "median_estimate": median(estimates) if estimates else float("nan"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--window", type=float, default=30.0)
    ap.add_argument("--levels", type=float, nargs="+", default=[0.0, 0.5, 1.0])
    ap.add_argument("--load-devices", type=int, default=8)
    ap.add_argument("--size", type=int, default=256, help="load matrix size (use ~4096 on a GPU)")
    ap.add_argument("--platform", default="cpu", help="devices to load and to read estimates of")
    ap.add_argument("--passes", type=int, default=2, help="1: levels once; 2: and again in reverse")
    ap.add_argument("--probe-interval", default="2s")
    ap.add_argument("--out-name", default="utilization", help="results file name")
    ap.add_argument("--daemon-args", default="", help="more jaxmon serve flags, e.g. '--collector.probe.repeats 1'")
    ap.add_argument("--load", type=float, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.load is not None:
        load(args.load, args.load_devices, args.size, args.platform)
        return

    daemon = Jaxmon(["--collector.probe.interval", args.probe_interval, *args.daemon_args.split()], name=args.out_name)
    windows: list[dict[str, float]] = []
    with running(daemon):
        wait_ready(daemon, daemon.url)
        n_devices = len(per_device(scrape(daemon.url), "jaxmon_device_info", args.platform))
        wait_for(daemon.url, all_calibrated(n_devices, args.platform), what="probes calibrated")
        levels = [*args.levels, *reversed(args.levels)] if args.passes > 1 else list(args.levels)
        for level in levels:
            w = window(daemon, level, args.window, args)
            windows.append(w)
            print(
                f"induced {100 * w['measured_duty']:5.1f} % (target {100 * level:.0f} %, load uses"
                f" {w['load_cores_used']:.2f} cores): estimate mean {100 * w['mean_estimate']:5.1f} %,"
                f" median {100 * w['median_estimate']:5.1f} % over {w['samples']:.0f} probe runs",
                flush=True,
            )
    summary = []
    for level in args.levels:
        ws = [w for w in windows if w["target_duty"] == level]
        induced = sum(w["measured_duty"] for w in ws) / len(ws)
        estimate = sum(w["mean_estimate"] * w["samples"] for w in ws) / max(sum(w["samples"] for w in ws), 1)
        error = 100 * (estimate - induced)
        summary.append(
            {
                "target_duty": level,
                "induced_duty": induced,
                "mean_estimate": estimate,
                "error_points": error,
                "met": abs(error) <= 10,
            }
        )
        print(
            f"level {100 * level:3.0f} %: induced {100 * induced:5.1f} %, estimated {100 * estimate:5.1f} %"
            f" ({error:+.1f} points) -> {'met' if abs(error) <= 10 else 'MISSED'}"
        )
    save(
        args.out_name,
        {
            "command": " ".join(["python bench/utilization.py", *sys.argv[1:]]),
            "platform": args.platform,
            "load": f"{args.load_devices} devices, {args.size}x{args.size} float32 tanh(x @ x), period {PERIOD}s",
            "summary": summary,
            "windows": windows,
        },
    )


if __name__ == "__main__":
    main()
