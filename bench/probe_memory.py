"""Probe memory footprint per device at the default size (n = 256).

    .venv/bin/python bench/probe_memory.py         # about 2 minutes

The figure is jaxmon_probe_memory_bytes (XLA's memory analysis of the compiled probe: arguments + output +
temporaries, allocated once) of each of 8 JAX CPU devices, against 3 x n^2 x 4 bytes. CPU devices have no
allocator stats, so as an independent check on the host, the daemon's RSS with the probe on is compared with
`--no-collector.probe` (both started side by side, twice, after calibration and 20 s), divided by 8 devices:
that difference also holds the compiled executables, the 8 probe threads and JAX's per-device state.
Target: <= 16 MiB per device.
"""

from __future__ import annotations

import argparse
import time

from common import Jaxmon, all_calibrated, median, per_device, proc_status, running, save, wait_for, wait_ready

MiB = 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--settle", type=float, default=20.0)
    args = ap.parse_args()

    footprints: dict[str, float] = {}
    rss_on, rss_off = [], []
    for i in range(args.rounds):
        on = Jaxmon(name=f"probe-mem-on-{i}")
        off = Jaxmon(["--no-collector.probe"], name=f"probe-mem-off-{i}")
        with running(on, off):
            wait_ready(on, on.url)
            wait_ready(off, off.url)
            samples = wait_for(on.url, all_calibrated(), what="probes calibrated")
            footprints = per_device(samples, "jaxmon_probe_memory_bytes")
            time.sleep(args.settle)
            rss_on.append(proc_status(on.pid)["VmRSS"])
            rss_off.append(proc_status(off.pid)["VmRSS"])
        print(f"round {i}: RSS probe on {rss_on[-1] / MiB:.1f} MiB, off {rss_off[-1] / MiB:.1f} MiB", flush=True)
    size = 256
    expected = 3 * size * size * 4
    worst = max(footprints.values())
    rss_per_device = (median(rss_on) - median(rss_off)) / 8
    print(
        f"jaxmon_probe_memory_bytes: {worst / 2**10:.0f} KiB per device (3 n^2 float32 = {expected / 2**10:.0f} KiB);"
        f" host RSS with probes - without, per device: {rss_per_device / MiB:.2f} MiB"
        f" -> {'met' if worst <= 16 * MiB else 'MISSED'}"
    )
    save(
        "probe_memory",
        {
            "command": "python bench/probe_memory.py",
            "probe_memory_bytes": footprints,
            "expected_3n2x4_bytes": expected,
            "rss_probe_on_bytes": rss_on,
            "rss_probe_off_bytes": rss_off,
            "rss_difference_per_device_bytes": rss_per_device,
            "met": worst <= 16 * MiB,
        },
    )


if __name__ == "__main__":
    main()
