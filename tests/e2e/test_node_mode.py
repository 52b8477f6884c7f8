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
from tests.helpers import Process, free_port, jaxmon_env, scrape

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
    """A check on the check: the default daemon does import JAX, and the same dump shows it."""
    proc, _, modules = _node_daemon(tmp_path, "--no-collector.probe")
    try:
        assert "jax" in _imported(proc, modules)
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
hook_before = "__getattr__" in vars(jaxmon)
step = jaxmon.step
bound = {n: n in vars(jaxmon) for n in jaxmon.__all__}
print(json.dumps({"before": before, "hook_before": hook_before, "hook_after": "__getattr__" in vars(jaxmon),
                  "bound": bound, "same": step is sys.modules["jaxmon.training"].step}))
"""


READING_ONLY = """
import json, sys
import jaxmon.sources.spool_codec
print(json.dumps(sorted(m for m in sys.modules if m.startswith("jaxmon.training"))))
"""


def test_a_daemon_reading_training_telemetry_loads_no_step_path() -> None:
    """The spool's codec imports jaxmon.training's reading.py: the package loads nothing of the step's side with it
    (the process's hand, the sampler, the XLA readers), which a training script loads at its first jaxmon.step."""
    out = subprocess.run([sys.executable, "-c", READING_ONLY], capture_output=True, text=True, check=True, cwd=ROOT)
    assert json.loads(out.stdout) == ["jaxmon.training", "jaxmon.training.reading"]


def test_import_jaxmon_loads_the_public_names_at_first_use_then_binds_them_all() -> None:
    """`import jaxmon` (the daemon's first import) loads no embedded exporter, publisher or tracker; the first public
    name read binds every one and removes the module's __getattr__, so later reads are plain (specialized)
    attributes and jaxmon.step() costs what it did."""
    out = subprocess.run([sys.executable, "-c", LAZY_NAMES], capture_output=True, text=True, check=True, cwd=ROOT)
    result = json.loads(out.stdout)
    assert result["before"] == ["jaxmon"] and result["hook_before"] is True
    assert result["hook_after"] is False and result["same"] is True
    assert result["bound"] == dict.fromkeys(result["bound"], True)
