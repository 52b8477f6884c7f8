"""Node mode: a daemon that reads only device-wide sources never imports JAX (its sys.modules and its mapped
libraries say so), and still serves every NVML series."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT, sample, wait_until
from tests.fakenvml import Scenario, device
from tests.helpers import FIXTURES, Process, free_port, jaxmon_env, scrape

# The daemon as `jaxmon serve` runs it, plus a SIGUSR2 handler (jaxmon leaves that signal alone) that writes the
# interpreter's imported modules to a file: what the daemon itself imported, read from inside it.
WRAPPER = """
import json, os, signal, sys
def dump(signum, frame):
    # Whole or not at all: the test reads the file as soon as it exists.
    with open(sys.argv[1] + ".part", "w") as fh:
        json.dump(sorted(sys.modules), fh)
    os.replace(sys.argv[1] + ".part", sys.argv[1])
signal.signal(signal.SIGUSR2, dump)
from jaxmon.cli import main
sys.exit(main(sys.argv[2:]))
"""


def _node_daemon(tmp_path: Path, *flags: str) -> tuple[Process, str, Path]:
    scenario = Scenario(tmp_path / "nvml.json", [device(i) for i in range(8)])
    port = free_port()
    modules = tmp_path / "modules.json"
    argv = [sys.executable, "-c", WRAPPER, str(modules), "serve", "--web.listen-address", f"127.0.0.1:{port}"]
    proc = Process([*argv, *flags], tmp_path / "node.log", jaxmon_env(scenario.env()), ROOT)
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: proc.alive() and bool(_try_scrape(url)), timeout=60, what="node daemon serving", detail=proc.log)
    return proc, url, modules


def _try_scrape(url: str) -> bool:
    try:
        s = scrape(url)
    except OSError:
        return False
    return sample(s, "jaxmon_collector_success", collector="nvml") == 1


def _imported(proc: Process, modules: Path) -> list[str]:
    proc.proc.send_signal(signal.SIGUSR2)
    wait_until(modules.exists, timeout=10, what="the module list written")
    names: list[str] = json.loads(modules.read_text())
    return names


def _wing(module: str) -> bool:
    """Whether `module` is the training wing's or the XLA readers' (jaxmon.training_readings is neither)."""
    return module in ("jaxmon.training", "jaxmon.xla") or module.startswith(("jaxmon.training.", "jaxmon.xla."))


def test_node_mode_never_imports_jax_and_serves_nvml(tmp_path: Path) -> None:
    proc, url, modules = _node_daemon(tmp_path, "--node")
    try:
        s = scrape(url)
        names = _imported(proc, modules)
        assert not [m for m in names if m.split(".")[0] in ("jax", "jaxlib")], "node mode imported JAX"
        assert "jaxmon.sources.local" not in names and "numpy" not in names
        # No TPU chip and no kubelet socket here: the tpu and kubernetes collectors are off, and grpc (about 20 MiB
        # of RSS) is never loaded for them.
        assert "grpc" not in names and "grpc" not in Path(f"/proc/{proc.pid}/maps").read_text()
        # What only a training process, a config file or basic auth needs (issue 22, bench/node_weight.py): the
        # embedded exporter, the publisher and the training tracker (jaxmon/__init__.py binds them on first use),
        # PyYAML (about 0.9 MiB) and bcrypt.
        unneeded = ("jaxmon.embedded", "jaxmon.publisher", "jaxmon.training.tracker", "yaml", "bcrypt")
        assert [m for m in unneeded if m in names] == []
        assert [m for m in names if _wing(m)] == []  # nothing of the training wing or the XLA readers
        maps = Path(f"/proc/{proc.pid}/maps").read_text()
        assert "jaxlib" not in maps and "xla_extension" not in maps  # no JAX shared library mapped either
        for gpu in range(8):
            labels = {"device": str(gpu), "platform": "gpu", "source": "nvml"}
            assert sample(s, "jaxmon_device_source_up", **labels) == 1
            assert sample(s, "jaxmon_device_memory_used_bytes", **labels) == (10 + gpu) * (1 << 30)
        assert not [k for k in s if k[0].startswith(("jaxmon_memory_", "jaxmon_probe_", "jaxmon_device_up"))]
        assert sample(s, "jaxmon_collector_success", collector="memory") is None
        build = [dict(k[1]) for k in s if k[0] == "jaxmon_build_info"]
        assert build and build[0]["jax_version"]  # read from package metadata, not from an import
    finally:
        assert proc.stop() == 0


def test_the_same_daemon_without_node_mode_imports_jax(tmp_path: Path) -> None:
    """A check on the check: the default daemon does import JAX, and the same dump shows it; it reads its JAX devices
    with nothing of the training wing or the XLA readers loaded either."""
    proc, _, modules = _node_daemon(tmp_path, "--no-collector.probe")
    try:
        names = _imported(proc, modules)
        assert "jax" in names and "jaxmon.sources.local" in names
        assert [m for m in names if _wing(m)] == []
    finally:
        proc.stop()


def test_node_mode_refuses_a_collector_that_needs_jax(tmp_path: Path) -> None:
    from jaxmon.compose import load_settings
    from jaxmon.settings import SettingsError

    try:
        load_settings(["--node", "--collector.memory"])
    except SettingsError as exc:
        assert "--node: node mode runs no collector that needs JAX, and collector memory does" in str(exc)
    else:
        raise AssertionError("--node --collector.memory was accepted")
    settings = load_settings(["--node"])
    assert settings.collector_options("memory").enabled is False
    assert settings.collector_options("probe").enabled is False


LAZY_NAMES = """
import json, sys
import jaxmon
before = sorted(m for m in sys.modules if m.startswith("jaxmon"))
step = jaxmon.step
after_step = {n: n in vars(jaxmon) for n in jaxmon.EXPORTS}
hook = "__getattr__" in vars(jaxmon)
start = jaxmon.start
print(json.dumps({"before": before, "after_step": after_step, "hook": hook, "bound": "start" in vars(jaxmon),
                  "same": step is sys.modules["jaxmon.training"].step and start is sys.modules["jaxmon.embedded"].start,
                  "dir": sorted(set(jaxmon.EXPORTS) - set(dir(jaxmon))), "all": sorted(jaxmon.__all__)}))
"""


DAEMON = """
import json, sys, time
from pathlib import Path
import jaxmon, jaxmon.cli, jaxmon.healthcheck
from jaxmon.web import asgi, config_error, server, signals, tracing
from jaxmon.collectors import registry
from jaxmon.compose import build_runtime, load_settings
from jaxmon.exposition import Exposition
from jaxmon.sources.spool_codec import spool_training
from jaxmon.training_readings import DeviceProfile, DeviceTraining, ProfileReading, TrainingReading

spool, replay = Path(sys.argv[1]), sys.argv[2]
reading = TrainingReading(
    steps_total=3,
    duration_buckets=((1.0, 3), (float("inf"), 3)),
    devices=(DeviceTraining("cpu", 0, model_flops_total=1e9, collective_bytes_total={("psum", "", "local"): 8.0}),),
    profile=ProfileReading({"taken": 1}, (DeviceProfile("cpu", 0, 1.0, {"compute": 1.0}),)),
)
document = json.loads(sys.argv[3])
training = spool_training(reading, time.time()).model_dump(mode="json")
document.update(schema="jaxmon.spool/3", time=time.time(), training=training)
(spool / "trainer.host-a.4242.json").write_text(json.dumps(document))
registry()
served = []
for argv in (
    ["--node"],
    ["--node", "--collector.spool.dir", str(spool)],
    ["--replay", replay, "--collector.spool.dir", str(spool), "--web.enable-profiling"],
):
    runtime = build_runtime(load_settings(argv))
    runtime.update_all_once()
    text = Exposition(runtime.snapshot, runtime.collectors, runtime.transform).render(False).decode()
    served.append(sorted({l.split()[2].removesuffix("_total") for l in text.splitlines() if l.startswith("# TYPE ")}))
    runtime.stop()
print(json.dumps({"modules": sorted(sys.modules), "served": served}))
"""


def test_a_daemon_in_every_mode_without_jax_loads_no_module_of_the_training_wing_or_the_xla_readers(
    tmp_path: Path,
) -> None:
    """What the daemon shares with the training wing and the XLA readers (the training reading, the sampled traces'
    terms, device facts) lives outside both: in a fresh interpreter doing what `jaxmon serve` does in each mode
    without JAX (node; node with a spool of a training publisher's reports; a replay beside that spool, profiling
    routes on), every collector's families and the exposition rendered, nothing of either is imported. The running
    daemons, node mode's and JAX's, are checked above."""
    document = (FIXTURES / "spool_document.json").read_text()
    argv = [sys.executable, "-c", DAEMON, str(tmp_path), str(FIXTURES / "shapes.json"), document]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, cwd=ROOT, timeout=120)
    result = json.loads(out.stdout.splitlines()[-1])
    node, spooled, replayed = result["served"]
    # A check on the check: the spooled workload's training families were rendered (its reading decoded, held at
    # birth and rendered), and the modules that share the training wing's types were loaded.
    assert "jaxmon_training_steps" not in node
    for served in (spooled, replayed):
        assert {"jaxmon_training_steps", "jaxmon_training_profile_seconds", "jaxmon_training_collective_bytes"} <= set(
            served
        )
    assert {"jaxmon.training_readings", "jaxmon.sampled_traces", "jaxmon.web.tracing"} <= set(result["modules"])
    assert [m for m in result["modules"] if _wing(m)] == []
    assert not [m for m in result["modules"] if m.split(".")[0] in ("jax", "jaxlib")]


def test_import_jaxmon_binds_every_public_name_as_a_plain_attribute_at_the_first_read_of_one() -> None:
    """`import jaxmon` (the daemon's first import) loads no embedded exporter, publisher or tracker; the first read of
    a public name imports its module alone and binds that name in jaxmon's namespace, where later reads find it."""
    out = subprocess.run([sys.executable, "-c", LAZY_NAMES], capture_output=True, text=True, check=True, cwd=ROOT)
    result = json.loads(out.stdout)
    assert result["before"] == ["jaxmon"]
    # The first read binds every public name as a plain attribute and drops the hook (reads a step makes are then
    # specialized by CPython: bench/module_attribute.py).
    assert all(result["after_step"].values()) and result["hook"] is False
    assert result["bound"] is True and result["same"] is True
    assert result["dir"] == [] and "step" in result["all"] and "__version__" in result["all"]
