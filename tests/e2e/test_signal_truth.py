"""jaxmon's own work is not the workload's: the probe's buffers and compilations stay out of the trainer's numbers."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import Samples, sample
from tests.helpers import Child, wait_for_fresh_samples, wait_for_samples

DEVICES = range(8)


def _probed_everywhere(s: Samples) -> bool:
    return all(sample(s, "jaxmon_device_up", device=str(i), platform="cpu", workload="w") == 1.0 for i in DEVICES)


def test_the_probe_adds_nothing_to_live_arrays_or_compilations(tmp_path: Path) -> None:
    """The same trainer with the probe on and off: equal live-array bytes on every device, equal compile counts."""
    # Every CPU device probed on its own: probe arrays and compilations on each of them.
    on = Child(
        tmp_path,
        "embedded",
        "--workload",
        "w",
        env={
            "JAXMON_COLLECTOR__PROBE__SIZE": "64",
            "JAXMON_COLLECTOR__PROBE__EACH_CPU_DEVICE": "true",
            # Calibrations 10 ms between seeds, not 100 ms: what is checked is where the probe's arrays and
            # compilations go, not its pacing.
            "JAXMON_COLLECTOR__PROBE__SPACING": "10ms",
        },
    )
    off = Child(tmp_path, "embedded", "--workload", "w", env={"JAXMON_COLLECTOR__PROBE__ENABLED": "false"})
    try:
        for child in (on, off):
            child.send("alloc 1 1048576")
            child.send("compile 3")
        probed = wait_for_samples(on.hello["url"], _probed_everywhere, "every device probed", timeout=120)
        assert sample(probed, "jaxmon_probe_memory_bytes", device="1", platform="cpu", workload="w")
        # Memory and compile updates that started after every command above, in both processes.
        samples = {}
        for key, child in (("on", on), ("off", off)):
            wait_for_fresh_samples(child.hello["url"], "compile")
            samples[key] = wait_for_fresh_samples(child.hello["url"], "memory")
        assert sample(samples["off"], "jaxmon_device_up", device="1", platform="cpu", workload="w") is None
        for i in DEVICES:
            labels = {"device": str(i), "platform": "cpu", "workload": "w"}
            live = {k: sample(s, "jaxmon_memory_live_array_bytes", **labels) for k, s in samples.items()}
            assert live["on"] == live["off"], (i, live)
        # Device 1 holds exactly the 1 MiB array the trainer made (the probe's 3 x 64 x 64 float32 are not there).
        assert sample(samples["on"], "jaxmon_memory_live_array_bytes", device="1", platform="cpu", workload="w") == (
            1048576.0
        )
        ident = {"workload": "w", "process_index": "0"}
        for name in ("jaxmon_jit_compilations_total", "jaxmon_compilation_cache_misses_total"):
            assert sample(samples["on"], name, **ident) == sample(samples["off"], name, **ident), name
    finally:
        on.close()
        off.close()
